"""forensics' S3 client against a real S3 server on 127.0.0.1 (SeaweedFS's ``weed server -s3``, tests/s3_env.py);
every check of what the bucket holds goes through the test's own boto3 client, not through forensics.
"""
from __future__ import annotations

import pytest

from tests.s3_env import SECRET_KEY, S3Server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    try:
        yield server.start()
    finally:
        server.stop()


def test_the_client_takes_the_sdk_environment_and_names_a_refusal(s3, monkeypatch):
    # GIVEN the server's endpoint and credentials in the AWS SDKs' environment only
    from forensics.errors import ObjectNotFound, ObjectStoreDenied
    from forensics.objstore.client import StoreOptions, open_client, translate_error

    for name, value in s3.env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    bucket = s3.make_bucket("client-env")
    # WHEN forensics' client writes through it
    client = open_client(StoreOptions())
    client.put_object(Bucket=bucket, Key="k", Body=b"evidence")
    # THEN the test's own client reads it back
    assert s3.client().get_object(Bucket=bucket, Key="k")["Body"].read() == b"evidence"
    # AND a refused secret and a missing bucket become our errors, one line, no secret in them
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    import botocore.exceptions

    with pytest.raises(botocore.exceptions.ClientError) as refused:
        open_client(StoreOptions(attempts=1)).put_object(Bucket=bucket, Key="k2", Body=b"x")
    err = translate_error(refused.value, f"s3://{bucket}/k2", StoreOptions())
    assert isinstance(err, ObjectStoreDenied) and "refused the credentials" in str(err)
    assert "\n" not in str(err) and "wrong-secret" not in str(err) and SECRET_KEY not in str(err)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    with pytest.raises(botocore.exceptions.ClientError) as missing:
        open_client(StoreOptions()).head_object(Bucket="no-such-bucket-here", Key="k")
    assert isinstance(translate_error(missing.value, "s3://no-such-bucket-here/k", StoreOptions()), ObjectNotFound)
