"""Lets PySpark find the ``nsq`` data source without ``spark.dataSource.register``.

PySpark (4.x) imports every top-level module named ``pyspark_*`` and registers its
``DefaultSource`` under ``DefaultSource.name()``.
"""

from txnsq.spark import NSQDataSource as DefaultSource

__all__ = ["DefaultSource"]
