"""Redaction of secrets (always) and of host identities (on request) in evidence text.

Pure functions.  Everything from a crashed process — arguments, environment,
paths, thread names — passes through :class:`Redactor` before a report is
rendered, and the report states what was redacted.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Redactor", "SECRET_NAME", "redact_tree"]

SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL|AUTH|_KEY$|^KEY$)", re.I)
_ENV_PAIR = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)=(?P<value>[^\s'\"]+)")
_OPTION_PAIR = re.compile(r"(?P<opt>--?[A-Za-z0-9][A-Za-z0-9_-]*)(?P<sep>[= ])(?P<value>[^\s'\"]+)")
_BEARER = re.compile(r"(?i)\b(bearer|token)\s+[A-Za-z0-9._~+/=-]{8,}")
_BASIC_URL = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]+):(?P<pw>[^@/\s]+)@")
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{5,}")
_KNOWN_TOKENS = re.compile(r"\b(ghp_[A-Za-z0-9]{20,}|gh[osu]_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|hf_[A-Za-z0-9]{20,}|glpat-[A-Za-z0-9_-]{20,})\b")
_IPV4 = re.compile(r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b")
_IPV6 = re.compile(r"\b(?:[0-9a-fA-F]{1,4}:){2,7}[0-9a-fA-F]{1,4}\b")
_HOSTNAME = re.compile(r"\b(?=[a-z0-9-]*[a-z])[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)+\b")
MASK = "[REDACTED]"


@dataclass
class Redactor:
    """Redacts secrets always; hosts (names, IPs, node and pod names) when ``hosts`` is set.

    Host replacements are consistent: the same node is ``node-1`` everywhere.

    >>> r = Redactor()
    >>> r.text("python -m exporter --token=abc123def456 NVIDIA_API_KEY=s3cr3t")
    'python -m exporter --token=[REDACTED] NVIDIA_API_KEY=[REDACTED]'
    """

    hosts: bool = False
    known_hosts: dict[str, str] = field(default_factory=dict)  # name -> kind ("node", "pod", "host")
    counts: dict[str, int] = field(default_factory=dict)
    _mapping: dict[str, str] = field(default_factory=dict)
    _per_kind: dict[str, int] = field(default_factory=dict)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def alias(self, value: str, kind: str) -> str:
        if value not in self._mapping:
            n = self._per_kind.get(kind, 0) + 1
            self._per_kind[kind] = n
            self._mapping[value] = f"{kind}-{n}"
        return self._mapping[value]

    def env_value(self, name: str, value: str) -> str:
        """One environment variable's value, as it may appear in a report."""
        if SECRET_NAME.search(name):
            self._count("environment values with secret-like names")
            return MASK
        return self.text(value)

    def text(self, s: str) -> str:
        if not s:
            return s
        s = _PRIVATE_KEY.sub(lambda m: (self._count("private keys"), MASK)[1], s)
        s = _BASIC_URL.sub(lambda m: (self._count("passwords in URLs"), f"{m['scheme']}{m['user']}:{MASK}@")[1], s)
        s = _BEARER.sub(lambda m: (self._count("bearer tokens"), f"{m.group(1)} {MASK}")[1], s)
        s = _JWT.sub(lambda m: (self._count("bearer tokens"), MASK)[1], s)
        s = _KNOWN_TOKENS.sub(lambda m: (self._count("access tokens"), MASK)[1], s)

        def pair(m: re.Match) -> str:
            if SECRET_NAME.search(m["name"]) and m["value"] != MASK:
                self._count("secret-like NAME=value pairs")
                return f"{m['name']}={MASK}"
            return m.group(0)

        def option(m: re.Match) -> str:
            if SECRET_NAME.search(m["opt"].lstrip("-").replace("-", "_")) and m["value"] != MASK and not m["value"].startswith("-"):
                self._count("secret-like command-line options")
                return f"{m['opt']}{m['sep']}{MASK}"
            return m.group(0)

        s = _ENV_PAIR.sub(pair, s)
        s = _OPTION_PAIR.sub(option, s)
        if self.hosts:
            s = self._hosts(s)
        return s

    def _hosts(self, s: str) -> str:
        for name in sorted(self.known_hosts, key=len, reverse=True):
            if name and name in s:
                kind = self.known_hosts[name]
                self._count(f"{kind} names")
                s = s.replace(name, self.alias(name, kind))
        s = _IPV4.sub(lambda m: m.group(0) if m.group(0).startswith("127.") else (self._count("IP addresses"), self.alias(m.group(0), "ip"))[1], s)
        s = _IPV6.sub(lambda m: (self._count("IP addresses"), self.alias(m.group(0), "ip"))[1], s)
        s = _HOSTNAME.sub(self._hostname, s)
        return s

    def _hostname(self, m: re.Match) -> str:
        name = m.group(0)
        # File names look like host names (gconv-modules.cache, exporter.py): only a name whose
        # last label is a domain suffix seen in clusters and public DNS, and that is not a path
        # component, is taken for a host.
        last = name.rsplit(".", 1)[-1]
        before = m.string[m.start() - 1] if m.start() else ""
        if last not in _DOMAIN_SUFFIXES or before in "/\\":
            return name
        self._count("host names")
        return self.alias(name, "host")

    def summary(self) -> list[str]:
        out = [f"{n} {what}" for what, n in sorted(self.counts.items())]
        return out or ["nothing matched the redaction rules"]


_DOMAIN_SUFFIXES = frozenset(
    "com net org io ai dev cloud app co edu gov mil int biz info us uk de fr cn jp kr in ru nl eu ca au ch se "
    "local localdomain internal cluster svc lan corp intra intranet home private example test".split()
)


def redact_tree(value: Any, r: Redactor, *, key: str | None = None) -> Any:
    """Apply ``r`` to every string in a JSON-like tree; env-like dicts by their variable names."""
    if isinstance(value, str):
        if key is not None and SECRET_NAME.search(key):
            return r.env_value(key, value)
        return r.text(value)
    if isinstance(value, dict):
        return {k: redact_tree(v, r, key=k if key in ("environ", "env", "environment") or _is_env_name(k) else None)
                for k, v in value.items()}
    if isinstance(value, list):
        return [redact_tree(v, r) for v in value]
    if isinstance(value, tuple):
        return tuple(redact_tree(v, r) for v in value)
    return value


def _is_env_name(k: str) -> bool:
    return k.isupper() and bool(re.fullmatch(r"[A-Z_][A-Z0-9_]*", k))
