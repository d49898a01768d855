"""The sections of ``bench.perf``, one module each, named as ``--only`` names them."""
