"""Loading the code location grows linearly with the number of definitions (issue: 1,000 continuous
queries timed the code server out): what Dagster's code server computes at load
(``benchmarks.location_load.load_location``) for N and 2N generated definitions, without a daemon."""

import pytest

from benchmarks.location_load import load_location, location_sql
from cq_engine.config import Settings

N = 100


@pytest.fixture(scope="module")
def locations(tmp_path_factory):
    out = {}
    for cqs, streams in ((N, 2), (2 * N, 4)):
        root = tmp_path_factory.mktemp(f"location_{cqs}")
        (root / "sql").mkdir()
        (root / "sql" / "defs.sql").write_text(location_sql(cqs, streams))
        out[cqs] = Settings(sql_dir=str(root / "sql"), warehouse=str(root / "wh"), home=str(root / ".cq"))
    return out


def test_the_location_holds_no_job_per_continuous_query_and_serves_linearly_many_bytes(locations):
    small, large = load_location(locations[N]), load_location(locations[2 * N])
    # cq_firings_job, cq_streams_job, cq_maintenance_job and Dagster's implicit asset job, whatever the
    # number of definitions.
    assert (small.jobs, large.jobs) == (4, 4)
    # cq_firings, cq_streams, cq_health and a switch sensor per stream; a switch schedule per continuous query.
    assert (small.sensors, large.sensors) == (3 + 2, 3 + 4)
    assert (small.schedules, large.schedules) == (N + 1, 2 * N + 1)  # and cq_maintenance
    assert (small.assets, large.assets) == (2 + N + 2, 2 + 2 * N + 4)
    # A job per definition over the shared multi-asset served every sink in each job's snapshot:
    # twice the definitions gave about four times the bytes. Linear: about twice.
    assert large.snapshot_bytes / small.snapshot_bytes < 2.4, (small, large)


def test_twice_the_definitions_load_in_about_twice_the_time(locations):
    # CPU time (a busy machine moves wall time far more), the best of three interleaved loads each;
    # quadratic growth gave about 4x, linear about 2x.
    times: dict[int, list[float]] = {N: [], 2 * N: []}
    for _ in range(3):
        for n, settings in locations.items():
            times[n].append(load_location(settings).cpu)
    ratio = min(times[2 * N]) / min(times[N])
    assert ratio < 3.2, times
