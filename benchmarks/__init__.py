"""txnsq's benchmarks: each module runs with ``python -m benchmarks.<name>``.

They print numbers and never assert on speed.
"""
