"""The end-to-end benchmark behind ``python -m fastload bench`` and
``bench/bench_loader.py``: synthetic workloads (``workloads``), the loaders
compared (``contenders``), one measurement in a fresh process (``measure``),
the matrix of them (``runner``) and how results are shown (``report``)."""
