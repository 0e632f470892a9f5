"""forensics upload: sealed capture bundles into an S3-compatible bucket, verified, then off the node."""
from __future__ import annotations

import sys

import click

from ..errors import EXIT_ERROR, EXIT_OK, ForensicsError
from ..options import FrontDoor, SIZE, json_option, store_options
from . import echo, emit, emit_json

__all__ = ["upload"]


@click.command("upload", cls=FrontDoor,
               common=("cluster", "keep", "endpoint_url", "as_json"))
@click.argument("bundles", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.argument("destination")
@click.option("--cluster", envvar="FORENSICS_CLUSTER", default="default", show_default=True,
              help="The cluster's name, the first part of each bundle's key (FORENSICS_CLUSTER).")
@click.option("--node", default=None, help="The node's name in the keys (default: the one the bundle recorded).")
@click.option("--keep", is_flag=True, help="Keep the node's copy after a verified upload (default: deleted).")
@click.option("--sse", type=click.Choice(["AES256", "aws:kms", "aws:kms:dsse"]), default=None,
              help="Server-side encryption of every object.")
@click.option("--sse-kms-key-id", default=None, help="The KMS key of --sse aws:kms (default: the bucket's).")
@click.option("--storage-class", default=None, help="STANDARD, STANDARD_IA, INTELLIGENT_TIERING, GLACIER_IR, ...")
@click.option("--part-size", type=SIZE, default="16M", show_default=True,
              help="Files from this size go in parts of this size (memory is about --concurrency parts' buffers).")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Parts of one file in flight at once.")
@click.option("--max-bandwidth", type=SIZE, default=None, help="Bytes per second one upload may send (e.g. 50M).")
@click.option("--attempts", type=click.IntRange(1, 20), default=4, show_default=True,
              help="Tries of each request (exponential backoff with jitter).")
@click.option("--rounds", type=click.IntRange(1, 20), default=3, show_default=True,
              help="Tries of each object after its requests' attempts all failed, 1, 2, 4 ... s apart.")
@store_options
@json_option
def upload(bundles, destination, cluster, node, keep, sse, sse_kms_key_id, storage_class, part_size, concurrency,
           max_bandwidth, attempts, rounds, endpoint_url, region, profile, as_json):
    """Upload sealed capture bundles to DESTINATION (s3://BUCKET/PREFIX), each object verified against the
    bundle's MANIFEST.json, then delete the node's copy (--keep keeps it).

    Keys: PREFIX/CLUSTER/NODE/NAMESPACE/POD/TIME-FINGERPRINT-CRASHID/..., the build-id store's objects
    under PREFIX/objects/; UPLOAD.json, written last, lists every object.  Endpoint, region and
    credentials as the AWS SDKs read them (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, AWS_WEB_IDENTITY_TOKEN_FILE).

    \b
    Exit codes: 0 every bundle uploaded and verified; 1 error (a bundle not uploaded or not verified:
    its copy on the node is kept; one line each); 2 usage.
    """
    from ..objstore.client import StoreOptions, parse_object_url
    from ..objstore.upload import read_place, upload_bundle
    from ..output import count, json_document

    try:
        dest = parse_object_url(destination)
    except ForensicsError as e:
        raise click.BadParameter(str(e), param_hint="DESTINATION") from e
    if part_size < 5 << 20:
        raise click.BadParameter("at least 5M (S3's smallest part)", param_hint="--part-size")
    opts = StoreOptions(endpoint_url=endpoint_url, region=region, profile=profile, attempts=attempts, rounds=rounds,
                        part_size=part_size, concurrency=concurrency, max_bandwidth=max_bandwidth, sse=sse,
                        sse_kms_key_id=sse_kms_key_id, storage_class=storage_class)
    results, failed = [], 0
    for bundle in bundles:
        try:
            results.append(upload_bundle(bundle, dest, read_place(bundle, cluster=cluster, node=node), opts,
                                         keep=keep))
        except ForensicsError as e:
            if len(bundles) == 1:
                raise
            failed += 1
            echo(f"forensics: error: {e}", err=True)
    if as_json:
        emit_json(json_document("upload", {"uploads": results, "failed": failed}), None, False)
    else:
        emit([f"{r.url}: {count(len(r.objects), 'object')} ({sum(o.uploaded for o in r.objects)} uploaded, "
              f"{sum(not o.uploaded for o in r.objects)} already there), {r.bytes_uploaded:,} bytes sent, verified "
              f"({', '.join(sorted({o.verified_by for o in r.objects}))}); "
              + ("the node's copy deleted" if r.deleted else "the node's copy kept") for r in results], None, False)
    sys.exit(EXIT_ERROR if failed else EXIT_OK)
