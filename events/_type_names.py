"""Exception type names as logs record them, and the upgrade of older logs.

From schema version 2 on, an exception of this distribution's packages is
recorded by its public path (``exporters.SpanExportError``): every
exception class a package exports sets its ``__module__`` to that package,
so code can move between private modules without changing what logs,
reports and spans say. Version 1 logs recorded the private module
(``exporters._errors.SpanExportError``); :func:`public_type_names`
upgrades their records.

The upgrade is a rule, not a table of old names: a dotted name under one of
this distribution's top-level packages loses its ``_``-prefixed module
components. It holds for every exception class these packages had when
version 1 was written (a test checks each one). Names of other packages
(``mylib._impl.Error``), builtins and private classes are left as they are.
"""

from __future__ import annotations

from typing import Any

from ._errors import public_module
from ._exception_info import cut_chain

__all__ = ["public_type_name", "public_type_names"]


def public_type_name(name: str) -> str:
    """The public path of a version-1 exception type name.

    ``orchestrator._errors.StepTimeoutError`` -> ``orchestrator.StepTimeoutError``;
    a name outside :data:`~events._errors.DISTRIBUTION_PACKAGES`, a builtin's
    bare name or a name already public is returned unchanged. The last
    component (the class) is kept even when it is private.
    """
    module, _, qualname = name.rpartition(".")
    return f"{public_module(module)}.{qualname}" if module else name


def public_type_names(record: dict[str, Any]) -> dict[str, Any]:
    """The upgrade from schema version 1 to 2: rename the exception types of
    ``record``'s ``cause`` (and the causes, contexts and group members nested
    in it, cut to :data:`~events._exception_info.MAX_CHAIN` records as
    decoding cuts them) to their public paths, in copies of the records
    renamed. Anything that is not a JSON object where an exception record
    belongs is left for the codec's checks to reject.
    """
    cause = record.get("cause")
    if isinstance(cause, dict):
        record["cause"] = cut_chain(cause, rename=public_type_name)
    return record
