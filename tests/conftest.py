"""pytest: install the reactor chosen by ``$TXNSQ_TEST_REACTOR`` (see
``tests/support/reactors.py``) before any test module imports the reactor."""

from tests.support.reactors import install_test_reactor

install_test_reactor()
