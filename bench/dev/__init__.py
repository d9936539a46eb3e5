"""Developer tools: the docs check, the docs tables, the records' schema doc, gpu_check's plan and its time split.

Each is run by hand or by a script (``python -m bench.dev.NAME``) and may import any layer of bench/; no library
module imports this package (``tests/test_layers.py``), so a user's sweep never loads it.
"""
