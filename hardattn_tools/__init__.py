"""Tooling around the plugin, which ``--user-dir`` never loads: benchmarks
(``fixtures``: models, tasks and batches; ``timing``: side-by-side runs;
``reporting``: results as JSON and Markdown), ``profiling`` of attention
sublayers, ``scoring`` (BLEU of fairseq-generate output), ``synthetic``
tasks, ``plotting`` and ``average_checkpoints``. The command lines are in
``scripts/``.
"""
