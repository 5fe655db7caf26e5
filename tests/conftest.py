import pytest


@pytest.fixture(scope="session")
def spark():
    """One real in-process Spark session shared by the whole test run."""
    from cq_engine.spark import local_session

    session = local_session(app_name="cq-engine-tests")
    yield session
    session.stop()
