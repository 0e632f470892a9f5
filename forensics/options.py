"""Shared click options and parameter types: --json, -o/--output, --force, -v; sizes; coredump_filter."""
from __future__ import annotations

import click

__all__ = ["json_option", "output_option", "force_option", "verbose_option", "SIZE", "parse_coredump_filter",
           "store_options"]

json_option = click.option("--json", "as_json", is_flag=True,
                           help="Write one JSON document to stdout (logs go to stderr).")
def _output(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``-o -`` is standard output; any other path is checked before the command works (its directory exists:
    none is created; it is no directory, device or kernel file)."""
    from .output import STDOUT, check_output_path

    if value is None or value == STDOUT:
        return None
    check_output_path(value)
    return value


output_option = click.option(
    "-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default=None, callback=_output,
    help="Write the result to FILE instead of stdout (never overwrites without --force; - is stdout; the "
         "directory must exist).",
)
force_option = click.option("--force", is_flag=True, help="Allow --output to replace an existing file.")
verbose_option = click.option("-v", "--verbose", count=True,
                              help="More detail on stderr (every warning of the analysis; with verify-imports, every "
                                   "path looked at).")

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class _Size(click.ParamType):
    """A byte count: ``4096``, ``512M``, ``20G``."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        s = str(value).strip().lower()
        for suffix in ("ib", "b"):
            if s.endswith(suffix) and len(s) > len(suffix):
                s = s[: -len(suffix)]
                break
        unit = s[-1] if s and s[-1] in _SIZE_UNITS else ""
        num = s[:-1] if unit else s
        try:
            return int(float(num) * _SIZE_UNITS[unit])
        except ValueError:
            self.fail(f"{value!r} is not a size (e.g. 4096, 512M, 20G)", param, ctx)


SIZE = _Size()


def parse_coredump_filter(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """click callback: ``/proc/PID/coredump_filter`` given in hexadecimal (9 bits)."""
    if value is None:
        return None
    try:
        v = int(value, 16)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not hexadecimal (e.g. 0x33)") from None
    if not 0 <= v <= 0x1FF:
        raise click.BadParameter("coredump_filter has 9 bits (0x0-0x1ff)")
    return v


def store_options(f):
    """--endpoint-url, --region, --profile: an S3-compatible store, over what the AWS SDKs' environment says
    (AWS_ENDPOINT_URL, AWS_REGION, AWS_PROFILE); credentials only from that environment, never a flag."""
    for option in reversed((
            click.option("--endpoint-url", default=None, metavar="URL",
                         help="The S3 endpoint (MinIO, Ceph RGW, SeaweedFS...); default AWS_ENDPOINT_URL, else AWS."),
            click.option("--region", default=None, help="The bucket's region; default AWS_REGION."),
            click.option("--profile", default=None,
                         help="A profile of the AWS config files; default AWS_PROFILE (credentials are read the AWS "
                              "SDKs' way: environment, profile, web-identity token file; never from a flag)."))):
        f = option(f)
    return f
