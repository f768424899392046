# Yours: `copier update` never rewrites this file. The sources the template ships are in data/; the
# interface a source implements is data/source.py's Source.
"""Your data sources: the name ``data.source`` selects each by, and the ``data`` keys they read.

A source of your own is one module (a subclass of :class:`~.data.source.Source`, e.g. in
``src/<package>/csv_source.py``) and one line here naming it::

    SOURCES = {"csv": ".csv_source:CSVSource"}  # then: python -m <package> train data.source=csv

The module is imported only when its source is used. Implement ``write_samples`` (the sample-data
protocol, see data/source.py) and ``sample-data`` writes it sample data, and the project's tests
(tests/test_sources.py) check it as they check the source the template ships: every sample once
per epoch over ranks and workers, bad samples counted, an exact resume, and the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``name -> "module:Class"``, the module relative to this package (or absolute).
SOURCES: dict[str, str] = {}


@dataclass
class SourceKeys:
    """``data.*`` keys your sources read: add a field (with a comment above it) and read it as ``cfg.<key>``
    in your source, whose ``cfg`` is the ``data`` section; ``config`` then prints it with the rest."""

    def __post_init__(self) -> None:  # check your keys' ranges here (errors.require)
        pass
