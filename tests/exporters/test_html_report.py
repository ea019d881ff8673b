"""The HTML report's structure and escaping, without a browser (the page as
a browser shows it: tests/orchestrator/cli/test_html_in_browser.py)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import attrs
import pytest

from events import Event, RunOutcome, replay
from events.testing import EventStream, exception_info
from exporters import report_html

from .html_runs import HOSTILE, synthetic_run


def page_of(runs: list[list[Event]]) -> str:
    return report_html(replay(runs))


class Elements(HTMLParser):
    """Every start tag with its attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(page: str) -> Elements:
    parser = Elements()
    parser.feed(page)
    parser.close()
    return parser


@pytest.fixture(scope="module")
def failed() -> str:
    return page_of(synthetic_run(8, failing=2, message=HOSTILE))


def test_hostile_exception_text_stays_text(failed: str) -> None:
    tags = parse(failed).tags
    assert "script" not in [tag for tag, _ in tags]  # the page has none of its own
    assert "img" not in [tag for tag, _ in tags]
    assert not any(name.startswith("on") for _, attrs in tags for name in attrs)
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in failed
    assert HOSTILE in "".join(parse(failed).text)


def test_control_and_bidirectional_characters_are_shown_as_escapes() -> None:
    # An override would show the text reversed (and the rest of its line);
    # a NUL the browser drops: the page shows them as the text report does.
    message = "boom\u202eereh toor on\x00\x1b[2J\u2066x"
    page = page_of(synthetic_run(2, failing=1, message=message))
    assert not re.search("[\x00-\x08\x0b-\x1f\u202a-\u202e\u2066-\u2069]", page)
    text = "".join(parse(page).text)
    assert "boom\\u202eereh toor on\\x00\\x1b[2J\\u2066x" in text


def test_hostile_step_names_and_faults_stay_text() -> None:
    stream = EventStream(run_id='r"><b>x</b>', rank=0)
    stream.run_started(simulated="<i>sim</i>", injected=('0:a="><script>x()</script>',))
    stream.started('s"><script>y()</script>').succeeded('s"><script>y()</script>')
    stored = stream.run_finished()
    page = report_html(replay(stored))
    tags = parse(page).tags
    assert "script" not in [tag for tag, _ in tags]
    assert "i" not in {tag for tag, _ in tags}
    assert "<b>x</b>" not in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page
    steps = [attrs["data-step"] for tag, attrs in tags if "data-step" in attrs]
    assert steps == ['s"><script>y()</script>']


def test_the_page_fetches_nothing(failed: str) -> None:
    tags = parse(failed).tags
    # No link leaves the page (the root-cause box links to its step, on it).
    found = [attrs for _, attrs in tags if {"src", "href", "srcset", "action"} & set(attrs)]
    assert all(set(attrs) == {"href"} and attrs["href"].startswith("#") for attrs in found)
    assert not re.search(r"url\(|@import|https?://", failed)
    [csp] = [a["content"] for t, a in tags if a.get("http-equiv") == "Content-Security-Policy"]
    assert csp is not None
    assert csp.startswith("default-src 'none'")
    assert "script-src 'none'" in csp


def test_outcome_and_root_cause_come_before_the_lanes(failed: str) -> None:
    assert failed.index('id="outcome"') < failed.index('id="root-cause"')
    assert failed.index('id="root-cause"') < failed.index('id="lanes"')
    cause = failed[failed.index('id="root-cause"') : failed.index("</section>")]
    assert "rank 2, step attention" in cause
    assert cause.index("RuntimeError") < cause.index("caused by") < cause.index("OSError")
    assert 'id="simulated">h200x8<' in failed
    assert "injected faults: <code>2:x</code>" in failed


def test_identical_ranks_share_a_lane_and_the_failed_one_comes_first(failed: str) -> None:
    lanes = [a for t, a in parse(failed).tags if a.get("class") == "lane"]
    assert [(a["data-ranks"], a["data-outcome"]) for a in lanes] == [
        ("rank 2", "failed"),
        ("ranks 0-1,3-7", "failed"),
    ]


def test_steps_nest_under_their_parents_in_each_lane(failed: str) -> None:
    first_lane = failed.split('class="lane"')[1]
    steps = re.findall(r'data-step="([^"]+)".*?padding-left:(\d+)px', first_lane)
    assert steps[:7] == [
        ("process_group", "0"),
        ("platform", "0"),
        ("platform/tpu", "14"),
        ("platform/cuda", "14"),
        ("platform/rocm", "14"),
        ("attention", "0"),
        ("attention/FLASH_ATTN", "14"),
    ]
    assert failed.count('class="step root"') == 1
    assert 'class="step root" data-step="attention/FLASH_ATTN"' in failed


def test_a_step_opens_to_its_outcome_reasons_chain_messages_and_decisions() -> None:
    page = page_of(synthetic_run(4))
    lane = page.split('class="lane"')[1]
    tpu = lane[lane.index('data-step="platform/tpu"') :].split("</details>")[0]
    assert ">absent<" in tpu
    assert "no libtpu" in tpu
    attention = lane[lane.index('data-step="attention"') :].split("</details>")[0]
    assert "decision <code>attention_backend</code> = <code>&quot;FLASH_ATTN&quot;</code>" in (
        attention
    )
    assert "[ranks 0-3]" in attention
    failed = page_of(synthetic_run(4, failing=1))
    flash = failed[failed.index('data-step="attention/FLASH_ATTN"') :].split("</details>")[0]
    assert "RuntimeError" in flash
    assert "caused by" in flash
    assert "libflash.so" in flash
    assert "messages:" in flash
    assert "[rank 1]" in flash


def test_messages_are_grouped_by_rank_set() -> None:
    page = page_of(synthetic_run(16, failing=5))
    messages = page[page.index('id="messages"') :].split("</section>")[0]
    # A rank set breaks after a comma only.
    assert "<td>rank&nbsp;5</td>" in messages
    assert "<td>ranks&nbsp;0-4,<wbr>6-15</td>" in messages
    decisions = page[page.index('id="decisions"') :].split("</section>")[0]
    assert "attention_backend@attention" in decisions
    assert "ranks&nbsp;0-4,<wbr>6-15" in decisions


def test_a_healthy_run_says_so_and_has_one_lane() -> None:
    page = page_of(synthetic_run(8))
    assert 'id="root-cause" class="fine"' in page
    assert page.count('class="lane"') == 1
    assert 'data-ranks="ranks 0-7"' in page


@pytest.mark.slow
def test_a_thousand_ranks_make_a_small_page() -> None:
    failed = page_of(synthetic_run(1024, failing=517))
    healthy = page_of(synthetic_run(1024))
    assert failed.count('class="lane"') == 2
    assert healthy.count('class="lane"') == 1
    # 16 KB and 9 KB when written; the lanes do not grow with the ranks.
    assert len(failed.encode()) < 100_000
    assert len(healthy.encode()) < 100_000


def test_a_rank_without_events_gets_its_own_lane() -> None:
    runs = synthetic_run(4)[:3]
    page = report_html(replay(runs))
    assert 'data-ranks="rank 3"' in page
    assert "wrote no events (no log)" in page
    lanes = [a["data-ranks"] for t, a in parse(page).tags if a.get("class") == "lane"]
    assert lanes == ["rank 3", "ranks 0-2"]
    assert page.index('id="root-cause"') < page.index('id="lanes"')


def test_texts_that_differ_by_rank_stay_in_one_lane() -> None:
    page = page_of(synthetic_run(1024, failing=517, distinct=True))
    lanes = [a["data-ranks"] for t, a in parse(page).tags if a.get("class") == "lane"]
    assert lanes == ["rank 517", "ranks 0-516,518-1023"]
    exchange = page[page.index('data-step="exchange"') :].split("</details>")[0]
    assert "(seen by rank 0)" in exchange
    assert '<div class="variant">rank 7:</div>' in exchange
    assert "1015 more variants: ranks 8-516,518-1023" in exchange
    assert "and 1015 more step.failed messages, from ranks 8-516,518-1023" in exchange
    messages = page[page.index('id="messages"') :]
    # rank 517's own step.failed is one of the eight rows shown
    assert "and 1016 more step.failed messages, from ranks 7-516,518-1023" in messages
    # 22 KB when written (16 KB when every rank says the same).
    assert len(page.encode()) < 100_000


def test_no_events_make_a_page_that_does_not_say_all_is_well() -> None:
    page = report_html(replay([]))
    assert 'id="root-cause"><b>No root cause</b>: the run ended incomplete.' in page
    assert "Ranks (0 lanes for 0 ranks)" in page


def test_a_rank_that_died_hung_says_where_it_waited_and_shows_the_stack() -> None:
    stream = EventStream(run_id="hung", rank=0)
    stream.run_started()
    stream.started("attention")
    stream.stalled("attention", 20.0)
    page = page_of([stream.events])
    cause = page[page.index('id="root-cause"') :].split("</section>")[0]
    assert "the process died before the rank finished" in cause
    assert "waiting in wait_for_fabric (fabric.py:42) after 20.0 s" in cause
    assert "where thread <code>step attention</code> waited, innermost first" in cause
    assert "<pre>wait_for_fabric (fabric.py:42)</pre>" in cause
    assert "<div>in flight: attention</div>" in cause


def test_the_policy_forbids_every_fetch_script_form_and_base(failed: str) -> None:
    [csp] = [a["content"] for t, a in parse(failed).tags if a.get("http-equiv")]
    assert csp == (
        "default-src 'none'; style-src 'unsafe-inline'; script-src 'none'; "
        "img-src 'none'; form-action 'none'; base-uri 'none'"
    )


def test_a_lane_says_its_ranks_outcome_and_the_worst_come_first() -> None:
    # Rank 2 fails (the root cause), rank 1 is stopped, ranks 0 and 3 are ready.
    boom = exception_info("RuntimeError", "boom")
    runs = []
    for rank in range(4):
        stream = EventStream(run_id="lanes", rank=rank, world_size=4).run_started()
        stream.started("load")
        if rank == 2:
            stream.failed("load", boom)
            runs.append(stream.run_finished(RunOutcome.FAILED, cause=boom, failed_step="load"))
        elif rank == 1:
            runs.append(stream.cancelled("load").run_finished(RunOutcome.INTERRUPTED))
        else:
            runs.append(stream.succeeded("load").run_finished())
    lanes = [a for t, a in parse(page_of(runs)).tags if a.get("class") == "lane"]
    assert [(a["data-ranks"], a["data-outcome"]) for a in lanes] == [
        ("rank 2", "failed"),
        ("rank 1", "interrupted"),
        ("ranks 0,3", "ready"),
    ]


def test_a_lanes_heading_names_its_pids_and_its_fastest_and_slowest_rank() -> None:
    runs = []
    for rank, (pid, ms) in enumerate([(900, 30), (700, 10), (800, 20)]):
        stream = EventStream(run_id="lanes", rank=rank, world_size=3).run_started(pid=pid)
        stream.started("load").advance(ms * 1_000_000).succeeded("load")
        runs.append(stream.run_finished())
    page = page_of(runs)
    facts = page[page.index('<span class="lane-facts">') :].split("</span>")[0]
    assert facts.endswith(
        " · pids 700-900 · started 00:00:00.000 to 00:00:00.000 · "
        "fastest rank 1 (13.0 ms), slowest rank 0 (33.0 ms)"
    )


def test_a_lane_of_one_process_names_its_role_and_pid() -> None:
    stream = EventStream(run_id="engine", rank=0)
    stream.identity = attrs.evolve(stream.identity, role="engine core")
    stream.run_started().started("load").succeeded("load")
    page = page_of([stream.run_finished()])
    assert '<h3>rank 0 (engine core, pid 4000) <span class="badge ok">ready</span>' in page


def test_a_chain_says_whether_a_link_caused_or_was_handled() -> None:
    chained = exception_info(
        "RuntimeError",
        "bad kernel",
        cause=exception_info("OSError", "no library", context=exception_info("KeyError", "x")),
    )
    stream = EventStream(run_id="chain", rank=0).run_started().started("load")
    stream.failed("load", chained)
    page = page_of([stream.run_finished(RunOutcome.FAILED, cause=chained, failed_step="load")])
    cause = page[page.index('id="root-cause"') :].split("</section>")[0]
    links = re.findall(r"<span class=link>([^<]*)</span> <code>([^<]*)</code>", cause)
    assert links == [("caused by", "OSError"), ("while handling", "KeyError")]


def test_the_run_wide_sections_name_errors_warnings_and_the_cutoff(failed: str) -> None:
    messages = failed[failed.index('id="messages"') :].split("</section>")[0]
    assert '<tr><td><span class="badge bad">error</span></td><td><code>step.failed' in messages
    # Rank 3 of four wrote no log; the page is cut at seq 5.
    page = report_html(replay(synthetic_run(4)[:3], until=5))
    assert "replayed until seq <b>5</b>" in page
    warnings = page[page.index('<section id="warnings">') :].split("</section>")[0]
    assert "no events from rank 3 of world size 4" in warnings


def test_the_axis_zooms_from_the_first_step_that_waited() -> None:
    # The process group takes 43 of the run's 84 ms.
    page = page_of(synthetic_run(2))
    assert (
        '<label for="zoom">zoom: from the first step that waited for process_group (+43.0 ms)'
        "</label>"
    ) in page


def test_decision_divergences_given_are_listed_with_the_runs_own() -> None:
    import html

    from events import DecisionMade, Divergence

    runs = synthetic_run(2)
    decision = next(e for e in runs[0] if isinstance(e, DecisionMade))
    divergence = Divergence.of_decision(decision, "TRITON_ATTN")
    page = report_html(replay(runs), divergences=[divergence])
    section = page[page.index('id="divergences"') :].split("</section>")[0]
    assert f"<li>error <code>decision.divergence</code>: {html.escape(divergence.text)}" in section
