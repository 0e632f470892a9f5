"""Command-line options as records, without click: each option's spellings, kind, choices, default, help and
metavar written once, in a table both of a command's parsers read.

:mod:`forensics.options` makes click's options from these records (:func:`~forensics.options.click_option`),
so ``--help`` and click's parse come from the table; :func:`parse_args` reads a command line with the same
table the way click reads it, for the forms click accepts as they are, and says None for everything else
(help, a usage error, a repeated option, an option written another way), which click then reads itself --
so that ``forensics analyze`` runs without importing click (:mod:`forensics.commands.analyze_run`'s table).
The options every command shares (``--json``, ``-o``, ``--force``, ``-v``, the object store's) are records
here too.

Imports nothing but what ``forensics analyze`` loads anyway (:mod:`enum`, :mod:`forensics.records`,
:mod:`forensics.output`): its start-up pays one small module for it.

>>> JOBS = OptionSpec(names=("-j", "--jobs"), dest="jobs", kind=Kind.INT, default=0, help="Workers.")
>>> parse_args(INPUT, (JOBS, VERBOSE), ["-j", "3", "-v", "/"])
{'inputs': ('/',), 'jobs': 3, 'verbose': 1}
>>> parse_args(INPUT, (JOBS, VERBOSE), ["-j3", "/"]) is None  # click's to read
True
"""
from __future__ import annotations

import enum
import os
import stat

from .errors import ForensicsError
from .output import check_output_path
from .records import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a start-up cost of every analysis)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

__all__ = ["Kind", "OptionSpec", "ArgumentSpec", "parse_args", "is_duration", "parse_size", "SIZE_PATTERN", "INPUT",
           "JSON", "OUTPUT", "FORCE", "VERBOSE", "STORE", "STORE_DEADLINE"]


class Kind(enum.Enum):
    """What an option takes, and the type its value is converted to (click's type of the same name)."""

    FLAG = "flag"  # no value: True when given (click's is_flag)
    COUNT = "count"  # no value, repeatable: how many times given (click's count)
    TEXT = "text"  # a string (click.STRING)
    INT = "int"  # int(value) (click.INT)
    FLOAT = "float"  # float(value) (click.FLOAT)
    SECONDS = "seconds"  # a duration: float(value), finite and above 0 (forensics.options.SECONDS)
    CHOICE = "choice"  # one of an enum's values, the string itself (click.Choice of modes.values())
    PATH = "path"  # a path, checked only where it exists (click.Path(exists=False))


@record
class OptionSpec:
    """One option: what click is told of it, and all :func:`parse_args` needs.

    ``names`` are its spellings (``("-j", "--jobs")``); ``dest`` is the command function's parameter.
    ``default`` is the value when not given (a FLAG's is False, a COUNT's 0, whatever is written here).
    For a PATH: whether it may name a regular file or a directory, whether an existing one must be readable,
    and whether ``-`` is standard output (given to the command as None). ``check``, when set, is called with
    the value before the command runs and raises :class:`~forensics.errors.ForensicsError` when it will not do.
    """

    names: tuple[str, ...]
    dest: str
    kind: Kind
    help: str
    default: object = None
    show_default: bool = False
    metavar: str | None = None
    choices: type[enum.Enum] | None = None
    file_okay: bool = True
    dir_okay: bool = True
    readable: bool = True
    allow_dash: bool = False
    check: Callable[[str], None] | None = None
    #: one of the few options a newcomer needs: the command's default --help shows it (--help-all shows every one)
    common: bool = False

    @property
    def initial(self) -> object:
        """The command's value when the option is not on the command line."""
        return False if self.kind is Kind.FLAG else 0 if self.kind is Kind.COUNT else self.default


@record
class ArgumentSpec:
    """The positional arguments: one or more paths (click's ``nargs=-1, required=True``, a click.Path)."""

    dest: str
    file_okay: bool = True
    dir_okay: bool = True
    readable: bool = True


#: one or more paths, each a file or a directory, read by the command itself (a missing or unreadable one is its
#: to say: one line, exit 1)
INPUT = ArgumentSpec(dest="inputs", readable=False)

JSON = OptionSpec(names=("--json",), dest="as_json", kind=Kind.FLAG, common=True,
                  help="Write one JSON document to stdout (logs go to stderr).")
OUTPUT = OptionSpec(
    names=("-o", "--output"), dest="output", kind=Kind.PATH, allow_dash=True, check=check_output_path, metavar="FILE",
    common=True,
    help="Write the result to FILE instead of stdout (never overwrites without --force; - is stdout; the "
         "directory must exist).")
FORCE = OptionSpec(names=("--force",), dest="force", kind=Kind.FLAG, help="Allow --output to replace an existing file.")
VERBOSE = OptionSpec(names=("-v", "--verbose"), dest="verbose", kind=Kind.COUNT,
                     help="More detail on stderr (every warning of the analysis; with verify-imports, every path "
                          "looked at).")
#: an S3-compatible store, over what the AWS SDKs' environment says (AWS_ENDPOINT_URL, AWS_REGION, AWS_PROFILE);
#: credentials only from that environment, never a flag
STORE = (
    OptionSpec(names=("--endpoint-url",), dest="endpoint_url", kind=Kind.TEXT, metavar="URL",
               help="The S3 endpoint (MinIO, Ceph RGW, SeaweedFS...); default AWS_ENDPOINT_URL, else AWS."),
    OptionSpec(names=("--region",), dest="region", kind=Kind.TEXT, help="The bucket's region; default AWS_REGION."),
    OptionSpec(names=("--profile",), dest="profile", kind=Kind.TEXT,
               help="A profile of the AWS config files; default AWS_PROFILE (credentials are read the AWS SDKs' "
                    "way: environment, profile, web-identity token file; never from a flag)."),
)



def _check_deadline(value: object) -> None:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        seconds = float("nan")
    if not 1 <= seconds <= 86400:
        raise ForensicsError(f"--deadline {value}: seconds from 1 to 86400")


#: what an s3:// input's requests may take together (the readers: analyze, report)
STORE_DEADLINE = OptionSpec(
    names=("--deadline",), dest="deadline", kind=Kind.FLOAT, metavar="SECONDS", check=_check_deadline,
    help="With s3:// inputs: seconds all the object store's requests may take together (default 3600); each object "
         "also has a bound of its own (10 s, and 1 s a MiB).")


def parse_args(argument: ArgumentSpec, options: Sequence[OptionSpec], args: Sequence[str]) -> dict | None:
    """The command function's keyword arguments for ``args``, exactly as click would pass them; None for
    anything click should read itself: help, an unknown, repeated or bundled option (``-vv``, ``-j2``), ``--``,
    a value that starts with ``-``, no positional argument, a value click (or the option's ``check``) would
    refuse."""
    by_name = {name: spec for spec in options for name in spec.names}
    params: dict[str, Any] = {spec.dest: spec.initial for spec in options}
    positional: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-"):
            positional.append(arg)
            continue
        # click reads "--long=value", never "-s=value" (that is "-s" with the value "=value")
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        spec = by_name.get(name)
        if spec is None or (eq and spec.kind in (Kind.FLAG, Kind.COUNT)):
            return None
        if spec.kind is Kind.COUNT:
            params[spec.dest] += 1
            continue
        if spec.kind is not Kind.FLAG and not eq:
            if i >= len(args):
                return None
            value = args[i]
            i += 1
        if spec.dest in seen or value.startswith("-"):
            return None
        seen.add(spec.dest)
        params[spec.dest] = True if spec.kind is Kind.FLAG else _converted(spec, value)
        if params[spec.dest] is _REFUSED:
            return None
    if not positional or not all(_path_ok(p, argument.file_okay, argument.dir_okay, argument.readable)
                                 for p in positional):
        return None
    return {argument.dest: tuple(positional), **params}


_REFUSED = object()  # a value click would not take


def _converted(spec: OptionSpec, value: str) -> object:
    """``value`` as click's type for ``spec`` converts it; :data:`_REFUSED` where click (or ``spec.check``)
    would refuse it."""
    try:
        converted: object = (int(value) if spec.kind is Kind.INT
                             else float(value) if spec.kind in (Kind.FLOAT, Kind.SECONDS) else value)
    except ValueError:
        return _REFUSED
    if spec.kind is Kind.SECONDS and not is_duration(converted):
        return _REFUSED
    if spec.kind is Kind.CHOICE and value not in {m.value for m in spec.choices or ()}:
        return _REFUSED
    if spec.kind is Kind.PATH and not _path_ok(value, spec.file_okay, spec.dir_okay, spec.readable):
        return _REFUSED
    if spec.check is not None:
        try:
            spec.check(value)
        except ForensicsError:
            return _REFUSED  # click's parse runs the same check, and says what it says
    return converted


def is_duration(seconds: object) -> bool:
    """Whether a number of seconds is one a duration can be: finite and above 0 (``-1``, ``0``, ``nan`` are not).

    >>> is_duration(2.5), is_duration(0.0), is_duration(-1.0), is_duration(float("inf"))
    (True, False, False, False)
    """
    return isinstance(seconds, float) and 0 < seconds < float("inf")


#: a size as every command and the Helm chart take it (its values.schema.json holds the same pattern: tested): a
#: count of bytes, or with K, M, G or T -- alone, with i, B or iB, either case -- all binary (``2G`` = ``2Gi`` =
#: 2 << 30), a decimal fraction allowed (``1.5G``); under 8 PiB
SIZE_PATTERN = r"^[0-9]+(\.[0-9]+)?([KkMmGgTt][Ii]?)?[Bb]?$"
_SIZE_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


def parse_size(text: str) -> int:
    """The bytes a size says (:data:`SIZE_PATTERN`): the one size parser of the command line and the manifests.

    >>> parse_size("50G"), parse_size("2Gi"), parse_size("1.5k"), parse_size("4096"), parse_size("512MiB")
    (53687091200, 2147483648, 1536, 4096, 536870912)

    :raises ValueError: when ``text`` is not a size
    """
    import re
    from decimal import Decimal

    if not re.fullmatch(SIZE_PATTERN, text or ""):
        raise ValueError(f"{text!r} is not a size (a count of bytes, or with K, M, G, T, Ki, Mi, Gi, Ti: all binary, "
                         "e.g. 4096, 512M, 20Gi)")
    body = text.rstrip("Bb").rstrip("Ii")
    unit = body[-1].lower() if body[-1:].isalpha() else ""
    number = body[:-1] if unit else body
    size = int(Decimal(number) * (1 << _SIZE_SHIFT[unit]))
    if size >= 1 << 53:  # (the chart computes in float64, exact below 2**53)
        raise ValueError(f"{text!r} is not a size: larger than 8 PiB")
    return size


def _path_ok(path: str, file_okay: bool, dir_okay: bool, readable: bool) -> bool:
    """Whether click.Path(file_okay, dir_okay, readable) takes ``path``: it checks only a path that exists (one
    this user may not read, where ``readable`` is False, is the command's to say: ``PATH: permission denied``,
    exit 1)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return "\0" not in path
    if (not file_okay and stat.S_ISREG(st.st_mode)) or (not dir_okay and stat.S_ISDIR(st.st_mode)):
        return False
    return not readable or os.access(path, os.R_OK)
