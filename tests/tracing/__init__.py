"""End-to-end tracing tests through the real engine graph: real rank
processes started by the command line exporting to in-test OTLP receivers,
live spans against spans replayed from the stored logs, trace context
propagation into threads and isolated child processes, a collector that is
down, and the resource recorded for replay."""
