"""The ``nsq`` data source with executors in their own JVMs and Python workers:
:class:`tests.support.spark_cases.ClusterCases` on ``local-cluster[2,1,1024]``.

The reader's connections live in the driver's source process; its rows travel to the
executors inside the input partitions, and the writers publish from the executors.
"""

from __future__ import annotations

import pytest

from tests.support.processes import wait_for
from tests.support.spark import LOCAL_CLUSTER
from tests.support.spark_cases import ClusterCases, SparkTestCase

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class SparkClusterCasesLocalCluster(ClusterCases, SparkTestCase):
    """:class:`ClusterCases` on ``local-cluster[2,1,1024]``."""

    master = LOCAL_CLUSTER

    def test_executors_have_their_own_jvms(self) -> None:
        sc = self.spark.sparkContext

        def block_managers() -> list[str]:
            # "host:port" of every block manager: the driver's and each executor's JVM.
            return str(sc._jsc.sc().getExecutorMemoryStatus().keys().mkString(",")).split(",")

        managers = wait_for(lambda: len(block_managers()) == 3 and block_managers(), timeout=60)
        self.assertEqual(len(set(managers)), 3, managers)
