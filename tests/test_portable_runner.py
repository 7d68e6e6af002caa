"""The build on Beam's portability layer: `--runner PortableRunner` against
Beam's Python job service, with the SDK work done by an EXTERNAL worker pool
(both processes on 127.0.0.1). That is the protocol the Flink, Spark and
Dataflow job services speak (infra/README.md), so a stage that only works
in-process (an unpicklable closure, state in the launching process, a path
only the launcher sees) fails here. Node and chunk tables equal the direct
runner's."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_fixtures import free_port, wait_for_port
from support import ROOT, live_table
from ritrag.pipelines import build

pytestmark = pytest.mark.slow
SAMPLE_MIXED = ROOT / "sample" / "mixed"
COMMON = ["--input", str(SAMPLE_MIXED), "--site_depth", "1", "--embedding_model", "hashing:384"]


def start(module: str, *args: str, log: Path) -> subprocess.Popen:
    # The worker pool starts each SDK worker as `python` from PATH: this interpreter's.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"), env={**os.environ, "PATH": path})


@pytest.fixture
def job_service(tmp_path):
    """(job endpoint, worker pool address): Beam's local job service and an SDK worker pool."""
    job_port, pool_port = free_port(), free_port()
    processes = [
        start("apache_beam.runners.portability.local_job_service_main", "--port", str(job_port),
              log=tmp_path / "job_service.log"),
        start("apache_beam.runners.worker.worker_pool_main", "--service_port", str(pool_port),
              log=tmp_path / "worker_pool.log"),
    ]
    try:
        wait_for_port(job_port, 60)
        wait_for_port(pool_port, 60)
        yield f"127.0.0.1:{job_port}", f"127.0.0.1:{pool_port}"
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)


def test_the_sample_builds_on_the_portable_runner_as_on_the_direct_runner(job_service, tmp_path):
    job_endpoint, worker_pool = job_service
    direct, portable = tmp_path / "direct", tmp_path / "portable"
    build.run([*COMMON, "--out", str(direct)])
    build.run([*COMMON, "--out", str(portable), "--runner", "PortableRunner", "--job_endpoint", job_endpoint,
               "--environment_type", "EXTERNAL", "--environment_config", worker_pool])
    for kind in ("nodes", "chunks"):
        assert live_table(portable, kind) == live_table(direct, kind), kind
