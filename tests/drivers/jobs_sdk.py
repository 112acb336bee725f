"""Ray's Jobs SDK through ``eray-provider dashboard``, with the variables of ``eray-provider
env``: submit a job, follow its logs until it printed, stop it. Prints ``OK`` at the end.

``python jobs_sdk.py http://127.0.0.1:PORT``; every wait is bounded.
"""

from __future__ import annotations

import sys
import time

from ray.job_submission import JobStatus, JobSubmissionClient


def main(address: str) -> None:
    client = JobSubmissionClient(address)
    job = client.submit_job(
        entrypoint="python -c \"import time; print('hello-job', flush=True); time.sleep(300)\""
    )
    print("SUBMITTED", job, flush=True)
    deadline = time.monotonic() + 180
    while "hello-job" not in client.get_job_logs(job):
        assert time.monotonic() < deadline, f"no output of job {job}: {client.get_job_status(job)}"
        time.sleep(1)
    print("LOGS hello-job", flush=True)
    assert client.stop_job(job)
    while client.get_job_status(job) != JobStatus.STOPPED:
        assert time.monotonic() < deadline, f"job {job} did not stop: {client.get_job_status(job)}"
        time.sleep(1)
    print("OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
