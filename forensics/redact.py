"""Redaction of secrets (always) and of host identities (on request) in evidence text.

Pure functions.  Everything from a crashed process — arguments, environment,
paths, thread names — passes through :class:`Redactor` before a report is
rendered, and the report states what was redacted.  A secret value found once
(``NVIDIA_API_KEY=...``, ``--token ...``) is masked wherever else it appears,
once :meth:`Redactor.learn` has seen the whole evidence.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (analyze --json redacts its document)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

__all__ = ["Redactor", "StreamRedactor", "SECRET_NAME", "MASK", "MIN_SECRET_LEN", "TITLE_KEYS", "redact_tree",
           "redact_document", "redact_lines", "facts_of", "masked_titles"]

# Word edges inside a variable or option name: start, end, or one of _ - . (case-insensitive).
_W0, _W1 = r"(?<![A-Za-z0-9])", r"(?![A-Za-z0-9])"
SECRET_NAME = re.compile(
    r"TOKEN(?!IZ)"  # GITHUB_TOKEN, AUTHTOKEN; not TOKENIZERS_PARALLELISM
    r"|SECRET|PASSW(?:OR)?[DT]|KENNWORT|PASSPHRASE|CREDENTIAL"  # PASSWORT, KENNWORT: German
    r"|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
    rf"|{_W0}KEYS?{_W1}"  # KEY, --key, SIGNING_KEY_PEM, SSH_KEYS; not KEYBOARD, MONKEY
    rf"|{_W0}CREDS{_W1}"
    rf"|{_W0}PAT{_W1}"  # GH_PAT, PAT_TOKEN, AZURE_DEVOPS_PAT (a personal access token); not PATH, PATCH
    rf"|(?<!BY)(?<!COM)(?<!SUR)(?<!MULTI)PASS{_W1}"  # DB_PASS, PGPASS, --pass; not BYPASS, COMPASS
    rf"|(?<=[_.-])PWD{_W1}"  # MYSQL_PWD; not PWD, OLDPWD (working directories)
    rf"|(?:{_W0}|(?<=BIND)|(?<=DB))PW{_W1}"  # DB_PW, --pw, LDAP_BINDPW, DBPW
    rf"|(?:MASTER|ACCOUNT|SHARED|SIGNING|ENCRYPTION|CLIENT|LICEN[CS]E|SERVICE|SESSION|DEPLOY|ADMIN)_?KEY"
    r"|AUTH(?!OR(?!I[SZ]))"  # AUTH_TOKEN, OAUTH, AUTHORIZATION; not AUTHOR, AUTHORITY
    r"|WEBHOOK|(?<![A-Z])DSN(?![A-Z])"  # SLACK_WEBHOOK_URL, SENTRY_DSN: the URL is the secret
    r"|(?-i:(?<=[a-z0-9])(?:Key|Token|Secret|Pass|Pwd)s?(?![a-z]))",  # camelCase: accountKey, dbPass
    re.I,
)
MASK = "[REDACTED]"
#: a secret value this long is masked wherever else it appears (a learned secret); a shorter one only where its
#: structure names it: "--api-key SIGSEGV" must not blank every "SIGSEGV" of the report
MIN_SECRET_LEN = 8
#: keys whose strings are a document's title or signature: a mask there is reported (Redactor.masked_in)
TITLE_KEYS = frozenset({"signature", "title"})
#: query and connection-string parameters that are secrets though their names do not say so
_PARAM_SECRETS = frozenset({"sig", "signature", "x-amz-signature", "x-amz-credential", "x-goog-signature",
                            "x-goog-credential", "pwd"})
_VALUE = r"(?:\"[^\"\n]*\"|'[^'\n]*'|[^\s'\"]+)"  # "x y", 'x y' or a bare word
_ENV_PAIR = re.compile(rf"(?P<name>\b[A-Za-z_][A-Za-z0-9_]*)=(?P<value>{_VALUE})")
_OPTION_PAIR = re.compile(rf"(?<![A-Za-z0-9_-])(?P<opt>--?[A-Za-z0-9][A-Za-z0-9_-]*)(?P<sep>=|\s+)(?P<value>{_VALUE})")
_USER_OPTION = re.compile(  # curl -u admin:pw, --user 'admin:p w', --proxy-user=a:b
    r"(?<![A-Za-z0-9_-])(?P<opt>-u|--user|--proxy-user)(?P<sep>=|\s+|(?<=-u))"
    r"(?:(?P<q>[\"'])(?P<quser>[^:'\"\n]*):(?P<qpw>[^'\"\n]+)(?P=q)|(?P<user>[^\s:'\"]+):(?P<pw>[^\s'\"]+))"
)
_AUTH_HEADER = re.compile(  # Authorization: Basic ..., Proxy-Authorization, X-Api-Key:, PRIVATE-TOKEN:
    r"(?i)\b(?P<name>(?:proxy-)?authorization|x-[a-z0-9-]*(?:token|key|secret|auth)[a-z0-9-]*|private-token)"
    r"(?P<sep>[\"']?\s*:\s*[\"']?)"
    r"(?P<scheme>(?:basic|bearer|token|digest|negotiate|ntlm|aws4-hmac-sha256)\s+)?(?P<value>[^\s'\",;]+)"
)
_BEARER = re.compile(r"(?i)\b(bearer|token)\s+(?P<value>[A-Za-z0-9._~+/=-]{8,})")
# URL userinfo: "scheme://user:password@host" with an empty user ("redis://:pw@host") or an "@" in the
# password ("https://deploy:p@ss@host": the password runs to the last "@" before the host)
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<pw>[^/\s]*)"
                           r"@(?=[^@/\s]*(?:[/?#\s\"'),;]|$))")
# a token as the whole userinfo: "https://<token>@github.com/...", "https://<key>@o0.ingest.sentry.io/1"
_URL_TOKEN_USER = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[A-Za-z0-9_.~+=-]{16,})@")
# a URL cut short inside its userinfo (the 80-byte command line of a core, a log line cut at its end):
# "redis://alice:PASSW" -- no "@" follows, so the part after ":" may be a password (not a port)
_URL_CUT = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<pw>(?!\d+$)[^/\s@]+)$")
# private-key blocks of any kind: PEM (RSA, EC, DSA, OPENSSH, ENCRYPTED, PKCS#8) and PGP, also cut short
# and SSH2's (RFC 4716 style, "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----") and PuTTY's private lines (a .ppk's
# "Private-Lines: N" up to its "Private-MAC:")
_BEGIN = (r"(?:-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|---- BEGIN SSH2 (?:ENCRYPTED )?PRIVATE KEY ----"
          r"|Private-Lines:[ \t]*\d+)")
_END = r"(?:-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|---- END SSH2 (?:ENCRYPTED )?PRIVATE KEY ----|Private-MAC:)"
_PRIVATE_KEY = re.compile(rf"{_BEGIN}.*?({_END}|\Z)", re.S)
_KEY_BEGIN = re.compile(_BEGIN)
_KEY_END = re.compile(_END)
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{5,}")
# webhook URLs whose path is the secret: the host stays, the path goes
_WEBHOOK = re.compile(r"(?P<base>https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)|"
                      r"(?:[a-z]+\.)?discord(?:app)?\.com/api/webhooks|[a-z0-9-]+\.webhook\.office\.com/webhookb2)/)"
                      r"(?P<secret>[A-Za-z0-9_@/.-]{8,})")
# known token formats, wherever they stand (inside a path, after "_"): GitHub, Slack, Stripe, AWS,
# Google, GitLab, Hugging Face, OpenAI/Anthropic-style "sk-", npm, PyPI, Docker Hub, SendGrid
_KNOWN_TOKENS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{22,}"
    r"|xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"
    r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{16,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}"
    r"|gl(?:pat|ptt|dt|rt|rtr|soat|cbt|oas|imt|agent|ffct|ft|wt|sa)-[A-Za-z0-9_-]{20,}(?:\.[0-9a-z]{9})?"  # GitLab
    r"|GR1348941[A-Za-z0-9_-]{20,}|nvapi-[A-Za-z0-9_-]{20,}"  # GitLab runner registration; NVIDIA NGC
    r"|hf_[A-Za-z0-9]{20,}|AGE-SECRET-KEY-1[0-9A-Z]{50,}"  # Hugging Face; age's identity
    r"|sk-(?:proj-|ant-[a-z0-9]+-)?[A-Za-z0-9_-]{20,}"
    r"|npm_[A-Za-z0-9]{30,}|pypi-[A-Za-z0-9_-]{40,}|dckr_pat_[A-Za-z0-9_-]{20,}"
    r"|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}"
    r")(?![A-Za-z0-9])")
# Telegram's bot token, in its API's URLs too (".../bot123456789:AAE.../sendMessage")
_TELEGRAM = re.compile(r"(?:(?<=bot)|(?<![A-Za-z0-9]))\d{5,16}:A[A-Za-z0-9_-]{34}(?![A-Za-z0-9_-])")
# a bare AWS secret access key: 40 of base64's characters, taken for one when it mixes cases and digits and holds a
# "/" or "+" (most do), or stands in a text that holds an access key ID too (a credentials CSV, a tuple of the two);
# a git hash (lowercase hex) is not one
_AWS_SECRET = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_AWS_KEY_ID = re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])")
# base64 of a JSON object (a service account's key, a .dockerconfigjson): masked whole when what it decodes to holds
# a secret by these rules
_B64_JSON = re.compile(r"(?<![A-Za-z0-9+/_-])(?:eyJ|ewo)[A-Za-z0-9+/_-]{12,65536}={0,2}(?![A-Za-z0-9+/=_-])")
# sqlcmd's (bcp's, osql's, isql's) -P PASSWORD; docker's (podman's, helm registry's...) login -p PASSWORD
_SQLCMD_P = re.compile(r"\b(?:sqlcmd|bcp|osql|isql)\b[^\n|;&]*?\s-P[ \t]*(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s'\"]+)")
_LOGIN_P = re.compile(r"(?<![\w-])login\b[^\n|;&]*?\s-p[ \t]+(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s'\"-][^\s'\"]*)")
# WireGuard's "wg set wg0 peer PUB preshared-key FILE" (and private-key): a file's name, or the key itself in
# <(echo KEY)
_WG_KEY = re.compile(r"(?<![\w-])(?:preshared|private)-key[ \t]+(?:<\([ \t]*(?:echo|printf)[ \t]+(?:-\w+[ \t]+)*"
                     r"['\"]?)?(?P<value>[^\s()'\"]+)")
# name:value with no space after the colon, for the names that are always a secret's ("password:hunter2")
_COLON_TIGHT = re.compile(r"(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*):"
                          r"(?P<value>(?!//)[^\s\"',;{}\[\]()<>]{4,})")
_STRONG_NAME = re.compile(r"(?i)passw(?:or)?[dt]|kennwort|passphrase|secret|token(?!iz)|api_?key|access_?key|pwd"
                          r"|(?<![a-z0-9])pat(?![a-z0-9])")
# a credential tuple: NAME("user", "password") or NAME = ("user", "password") -- requests' auth=(...),
# HTTPBasicAuth(...), creds = (...), client.login(...): its second item, where NAME is secret-like or a login
_CRED_TUPLE = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_.]*)[ \t]*(?:=[ \t]*[(\[]|[(\[])[ \t]*"
                         r"(?P<q1>['\"])[^'\"\n]{0,256}(?P=q1)[ \t]*,[ \t]*"
                         r"(?P<q2>['\"])(?P<value>[^'\"\n]{1,512})(?P=q2)")
_LOGIN_NAMES = frozenset({"login", "authenticate", "set_credentials"})  # SECRET_NAME has auth, creds, credentials
# a YAML block scalar under a secret-like key: "password: |" (or ">-") and the lines indented under it
# (the key may follow other words on its line, as in a command line that quotes a YAML file: the block is what is
# indented deeper than that line)
_YAML_BLOCK_HEAD = re.compile(r"(?m)(?:^|(?<=[ \t]))(?:- )?(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)[ \t]*:[ \t]*"
                              r"[|>][-+0-9]{0,2}[ \t]*\n")
# a shell line continuation ("--api-key abc\" then "def" on the next line): the value goes on past it
_CONTINUATION = re.compile(r"\\\n(?=\S)")  # only then is it one word: the shell drops the backslash and newline
# a positional word after a login/auth/token verb of a command line ("wandb login KEY", "vault login TOKEN", "npm
# token revoke ID"), past its options and up to three subcommand words: masked when it looks random
_VERB_ARG = re.compile(r"(?<![\w./-])(?:login|auth|token|authenticate)"
                       r"(?:[ \t]+(?:-{1,2}[A-Za-z][\w-]*(?:=\S*)?|[a-z][a-z-]{1,15})){0,3}[ \t]+"
                       r"(?P<value>[A-Za-z0-9._~+/=-]{16,512})(?=\s|$)")
# What every rule of Redactor._text but the learned secrets' needs in a text it changes, one search: "=" or ":"
# (pairs, headers, URLs, user:password, JSON, YAML, cookies, JDBC, .pgpass), a private key's BEGIN, a bearer token,
# a JWT, .netrc's password, curl's -b/--cookie, mysql's -p, a known token; a command-line option (the one rule
# left: "--api-key VALUE") is matched only under a secret-like name, which _text looks for apart.  A rule added
# to _text that needs none of these must add what it needs here.
_TRIGGER = re.compile("|".join([r"[=:]", r"-----BEGIN", r"(?i:bearer|token)", r"eyJ", r"password", r"-[bp]",
                                r"--cookie", _KNOWN_TOKENS.pattern]))
# ... and what the rules added since need, looked for as plain substrings (cheaper than more alternatives): SSH2's
# key block, sqlcmd -P, a login/auth verb, base64 JSON's "ewo", a credential tuple's quoted pair
_MORE_TRIGGERS = ("---- BEGIN", "-P", "login", "auth", "ewo")
_COOKIE_WORD = re.compile("(?i)cookie")
# "name": "value" in JSON (and Python reprs), name: value in YAML and logs -- judged by the name
_JSON_PAIR = re.compile(r"(?P<q>[\"'])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P=q)\s*:\s*"
                        r"(?P<vq>[\"'])(?P<value>(?:\\.|(?!(?P=vq))[^\\\n])*)(?P=vq)")
_COLON_PAIR = re.compile(r"(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>\s*:\s+)"
                         r"(?P<q>[\"'])?(?P<value>(?(q)[^\"'\n]+|[^\s\"',;]+))(?(q)(?P=q))")
# NAME=value pairs joined by ";" or "&" (Azure and SQL Server connection strings, query strings, JDBC URLs): each
# pair judged by its name; a value ends at the separator that starts the next pair, or is quoted or {braced}
_JOINED_PAIR = re.compile(
    r"(?:(?P<sep>(?<=[;&?]))|(?<![^\s\"'(,{]))"
    r"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*(?: [A-Z][A-Za-z0-9_]*)?)\s*=\s*"
    r"(?P<value>\"[^\"\n]*\"|'[^'\n]*'|\{[^}\n]*\}"
    r"|[^;&\s'\"]+(?:[ ][^;&\s'\"=]+)+(?=;)"
    r"|[^;&\s'\"]+?(?=[;&][A-Za-z_ ][A-Za-z0-9_. -]*=|[;&]\s*(?:$|[\s'\"])|[\s'\"]|$))")
# "key = value" and "key: value" lines (AWS credentials and other ini files, YAML), judged by the key
_LINE_PAIR = re.compile(r"(?m)^(?P<pre>[ \t]*(?:- )?(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)[ \t]*(?:=|:(?=[ \t]))[ \t]*)"
                        r"(?P<q>[\"']?)(?P<value>[^\n]*?)(?P=q)[ \t]*$")
# YAML's "- name: X" then "value: Y" (Kubernetes env, kubeconfig exec env), judged by X
_YAML_NAME_VALUE = re.compile(r"(?m)^(?P<pre>[ \t]*-?[ \t]*name:[ \t]*[\"']?(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)[\"']?"
                              r"[ \t]*\n[ \t]*value:[ \t]*)(?P<q>[\"']?)(?P<value>[^\n]*?)(?P=q)[ \t]*$")
_YAML_NAME_LINE = re.compile(r"[ \t]*-?[ \t]*name:")
# cookies: every value of a Cookie / Set-Cookie header and of curl's -b / --cookie, attributes kept
_COOKIE = re.compile(r"(?i)(?P<head>\b(?:set-)?cookie[\"']?\s*:\s*)(?P<q>)(?P<body>[^\n\"']*?)(?=\s+-|[\n\"']|$)")
_COOKIE_OPTION = re.compile(r"(?P<head>(?<![\w-])(?:-b|--cookie)[ =])(?P<q>[\"'])?(?P<body>(?(q)[^\n\"']*|[^\n\"' ]*))")
_COOKIE_PAIR = re.compile(r"(?P<name>[^=;\s]+)=(?P<value>[^;\s]*)")
_COOKIE_ATTRS = frozenset({"path", "domain", "expires", "max-age", "samesite", "priority"})
# mysql's password glued to -p (mysql -pSECRET), for the MySQL/MariaDB clients only (-p is a port elsewhere)
_MYSQL_P = re.compile(r"\b(?P<cmd>mysql\w*|mariadb\w*)\b(?P<mid>[^\n|;&]*?\s)-p(?P<value>[^\s'\"]+)")
# jdbc:oracle:thin:user/password@host
_JDBC_ORACLE = re.compile(r"(?P<pre>\bjdbc:oracle:[a-z]+:[^/@\s:]+/)(?P<value>[^@\s]+)(?=@)")
# .netrc: "machine H login U password P" on one line or several
_NETRC = re.compile(r"(?P<pre>(?:\b(?:machine|default|login|account)\b[^\n]*?|^[ \t]*)\bpassword[ \t]+)(?P<value>\S+)",
                    re.M)
# .pgpass: hostname:port:database:username:password
_PGPASS = re.compile(r"(?m)(?:^|(?<=\s))(?P<pre>(?=[^:\s]*[A-Za-z*])[^:\s#]+:(?:\d+|\*):[^:\s]+:[^:\s]+:)"
                     r"(?P<value>\S+)(?=\s|$)")
# <add key="Password" value="..."/> (.NET config, XML properties)
_XML_KEY_VALUE = re.compile(r"(?P<pre>\b(?:key|name)=(?P<q>[\"'])(?P<name>[^\"'\n]*)(?P=q)\s+value=(?P<vq>[\"']))"
                            r"(?P<value>[^\"'\n]*)(?P=vq)")
_XML_VALUE_NEXT = re.compile(r"\s+value=")
_IPV4 = re.compile(r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b")
# four or more groups, or a "::" -- not a PCI address (0000:3b:00, 00000000:18:00.0), which NVIDIA's
# logs and reports are full of
_IPV6 = re.compile(r"(?<![\w:.])(?:(?:[0-9a-fA-F]{1,4}:){3,7}[0-9a-fA-F]{1,4}"
                   r"|(?:[0-9a-fA-F]{1,4}:){1,6}:(?:[0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{1,4}){0,5})?)(?![\w:.])")
_HOSTNAME = re.compile(r"\b(?=[a-z0-9-]*[a-z])[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
                       r"(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)+\b")
# A known node/pod/host name is replaced only as a whole name: not inside an identifier or a file name
# (a node "vm" must leave nvmlDeviceGetFieldValues and pynvml.py alone), and not as a later label of
# another dotted name.  "-" separates: bundle directories and static pods join names with it
# (<stamp>-<namespace>-<pod>, <pod>-2, kube-proxy-<node>).
_NAME_BEFORE, _NAME_AFTER = r"(?<![A-Za-z0-9_.])", r"(?![A-Za-z0-9_])"


def _line_indent(text: str, at: int) -> int:
    """The indentation of the line of ``text`` that holds position ``at``."""
    start = text.rfind("\n", 0, at) + 1
    line = text[start:at]
    return len(line) - len(line.lstrip(" \t"))


def _open_block(text: str) -> int | None:
    """The indentation of the secret-like YAML block scalar whose lines run to the end of ``text``, if one does."""
    heads = [m for m in _YAML_BLOCK_HEAD.finditer(text) if SECRET_NAME.search(m["name"])]
    if not heads:
        return None
    depth = _line_indent(text, heads[-1].start())
    for line in text[heads[-1].end():].splitlines():
        if line.strip() and len(line) - len(line.lstrip(" \t")) <= depth:
            return None
    return depth


#: a value that is a language's literal, never a secret ("sort_keys=True" in a script: KEYS is a secret's name)
_LITERALS = frozenset({"True", "False", "None", "true", "false", "null", "nil"})


def _random_looking(v: str) -> bool:
    """Whether a word looks like a key rather than a name: a digit in it, no path, 3 bits of entropy a character.

    >>> _random_looking("0123456789abcdef0123456789abcdef01234567"), _random_looking("administrator-account")
    (True, False)
    """
    import math

    if not any(c.isdigit() for c in v) or v.startswith(("/", "./", "~")) or "//" in v:
        return False
    counts: dict[str, int] = {}
    for c in v:
        counts[c] = counts.get(c, 0) + 1
    return -sum(n / len(v) * math.log2(n / len(v)) for n in counts.values()) >= 3.0


def _unquote(v: str) -> tuple[str, str]:
    """(quote, inner) of a value as matched by ``_VALUE``: ``'"x y"'`` -> ``('"', 'x y')``."""
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[0], v[1:-1]
    return "", v


@dataclass
class Redactor:
    """Redacts secrets always; hosts (names, IPs, node and pod names) when ``hosts`` is set.

    Host replacements are consistent: the same node is ``node-1`` everywhere.

    >>> r = Redactor()
    >>> r.text("python -m exporter --token=abc123def456 NVIDIA_API_KEY=s3cr3t")
    'python -m exporter --token=[REDACTED] NVIDIA_API_KEY=[REDACTED]'
    >>> r.text('PASSWORD="x y" curl -u admin:pw -H "Authorization: Basic dXNlcjpwYXNz"')
    'PASSWORD="[REDACTED]" curl -u admin:[REDACTED] -H "Authorization: Basic [REDACTED]"'
    >>> r.text("thread abc123def456-worker")  # a value seen once is masked everywhere after
    'thread [REDACTED]-worker'
    >>> Redactor(hosts=True, known_hosts={"vm": "node"}).text("node=vm, pynvml.py nvmlInit vm:")
    'node=node-1, pynvml.py nvmlInit node-1:'
    """

    hosts: bool = False
    known_hosts: dict[str, str] = field(default_factory=dict)  # name -> kind ("node", "pod", "host")
    counts: dict[str, int] = field(default_factory=dict)
    secrets: set[str] = field(default_factory=set, repr=False)  # values masked once: masked everywhere
    #: the document's own facts (signal, function, library names, versions: :func:`facts_of`): a learned secret
    #: equal to one is not chased through the text (it is still masked where its structure names it)
    facts: set[str] = field(default_factory=set, repr=False)
    masked_in: set[str] = field(default_factory=set)  # the TITLE_KEYS under which redact_tree masked something
    _window_key: tuple[int, int] = field(default=(-1, -1), repr=False)
    _cache: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = field(default_factory=dict, repr=False)
    _cache_state: tuple[int, int, int] = field(default=(-1, -1, -1), repr=False)
    _window_set: frozenset[str] = field(default=frozenset(), repr=False)
    _chased_key: tuple[int, int] = field(default=(-1, -1), repr=False)
    _chased_re: re.Pattern | None = field(default=None, repr=False)  # any of _chased(), one alternation
    _facts_from: list = field(default_factory=list, repr=False)  # documents whose facts are read when first needed
    _mapping: dict[str, str] = field(default_factory=dict)
    _per_kind: dict[str, int] = field(default_factory=dict)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def _secret(self, what: str, value: str) -> str:
        """Count a masked ``value`` and remember it; returns :data:`MASK`."""
        self._count(what)
        if len(value) >= MIN_SECRET_LEN and MASK not in value and value not in MASK:
            self.secrets.add(value)
        return MASK

    def absorb(self, docs: dict[str, list]) -> None:
        """Add to :attr:`counts` what the documents' writers masked already (the ``redaction`` member
        :func:`redact_document` writes), so that a report says what was masked before it read them.

        :param docs: documents by kind (a report's evidence: ``{"analyze": [doc, ...], ...}``)
        """
        for doc in (d for v in docs.values() for d in v):
            red = doc.get("redaction") if isinstance(doc, dict) else None
            counts = red.get("counts") if isinstance(red, dict) else None
            for what, n in (counts.items() if isinstance(counts, dict) else ()):
                if isinstance(what, str) and isinstance(n, int) and n > 0:
                    self.counts[what] = self.counts.get(what, 0) + n

    def title_note(self, docs: Any, title: str) -> list[str]:
        """A footer line when a secret was masked in a signature of ``docs`` (by this redaction or its writer's)
        or in the ``title``; none otherwise."""
        masked = sorted(masked_titles(docs) | ({"title"} if MASK in title else set()))
        return [f"a secret of the crashed process was masked in the crash's {' and '.join(masked)}"] if masked else []

    def alias(self, value: str, kind: str) -> str:
        if value not in self._mapping:
            n = self._per_kind.get(kind, 0) + 1
            self._per_kind[kind] = n
            self._mapping[value] = f"{kind}-{n}"
        return self._mapping[value]

    def env_value(self, name: str, value: str) -> str:
        """One environment variable's value, as it may appear in a report."""
        if SECRET_NAME.search(name):
            if value == MASK:
                return MASK
            return self._secret("environment values with secret-like names", value)
        return self.text(value)

    def learn(self, tree: Any) -> None:
        """Collect the secret values anywhere in ``tree`` without counting, so that :meth:`text` masks
        them also where they appear before, or without, their name (an argument list, a thread name).

        >>> r = Redactor()
        >>> r.learn({"nvidia_smi": "python exporter.py nv-s3cr3t", "cmdline": ["exporter", "--api-key", "nv-s3cr3t"]})
        >>> r.text("python exporter.py nv-s3cr3t"), r.counts
        ('python exporter.py [REDACTED]', {'repeated secret values': 1})
        """
        scratch = Redactor(secrets=set(self.secrets))
        _learn_tree(tree, scratch)
        self.secrets |= scratch.secrets

    def text(self, s: str) -> str:
        """``s`` with every secret masked (counted, and learned to be masked wherever else it appears)."""
        if not s or (len(s) < MIN_SECRET_LEN and not self.hosts and "=" not in s and ":" not in s):
            return s  # too short for a token or a learned secret, and no pair in it
        state = (len(self.secrets), len(self.facts), len(self.known_hosts))
        if self._cache_state != state:
            self._cache.clear()
            self._cache_state = state
        hit = self._cache.get(s)
        if hit is not None:  # the same text again (a key, a path, a frame): the same result, counted again
            for what, n in hit[1]:
                self.counts[what] = self.counts.get(what, 0) + n
            return hit[0]
        before = dict(self.counts)
        out = self._text(s)
        if (len(self.secrets), len(self.facts), len(self.known_hosts)) == state and len(self._cache) < 65536:
            self._cache[s] = (out, tuple((w, n - before.get(w, 0)) for w, n in self.counts.items()
                                         if n != before.get(w, 0)))
        return out

    def _text(self, s: str) -> str:
        aws = len(s) >= 40 and _AWS_SECRET.search(s) is not None  # a bare AWS secret key needs no "=" or ":"
        if (not self.hosts and not aws and _TRIGGER.search(s) is None
                and not ("-" in s and SECRET_NAME.search(s.replace("-", "_")))
                and not any(t in s for t in _MORE_TRIGGERS) and not ("," in s and ("'" in s or '"' in s))):
            return self._known_secrets(s)  # no rule below can change it (most frames, files, lines of a report)
        return self._rules(s, aws)

    def _rules(self, s: str, aws: bool) -> str:
        """Every rule, each run only where the text holds what it needs to match (a plain substring check)."""
        continued: list[str] = []  # shell line continuations, each held by a place-holder the rules see as a value's
        if "\\\n" in s and "\0" not in s:
            def hold(m: re.Match) -> str:
                continued.append(m.group(0))
                return f"\0{len(continued) - 1}\0"

            s = _CONTINUATION.sub(hold, s)
        s = self._blocks_and_urls(s)
        s = self._tokens(s, aws)
        s = self._structures(s)
        s = self._pairs(s)
        if continued:  # the continuations no mask swallowed, given back
            s = re.sub("\0(\\d+)\0", lambda m: continued[int(m[1])], s)
        s = self._known_secrets(s)
        if self.hosts:
            s = self._hosts(s)
        return s

    def _blocks_and_urls(self, s: str) -> str:
        """Private keys, YAML block scalars, webhook URLs and URLs' user parts."""
        if "BEGIN" in s or "Private-Lines" in s:
            s = _PRIVATE_KEY.sub(self._private_key, s)
        if ("|" in s or ">" in s) and "\n" in s:
            s = self._yaml_blocks(s)
        if "://" in s:
            s = _WEBHOOK.sub(lambda m: m["base"] + self._secret("webhook URLs", m["secret"]), s)
            s = _URL_USERINFO.sub(self._userinfo, s)
            s = _URL_TOKEN_USER.sub(lambda m: m["scheme"] + self._secret("tokens in URLs", m["user"]) + "@", s)
            s = _URL_CUT.sub(lambda m: f"{m['scheme']}{m['user']}:"
                                       f"{self._secret('passwords in URLs cut short', m['pw'])}", s)
        return s

    def _tokens(self, s: str, aws: bool) -> str:
        """Headers, user:password options, bearer tokens, JWTs, tokens of known formats, base64 JSON, bare AWS
        secret keys, credential tuples and JSON pairs."""
        key_id = aws and _AWS_KEY_ID.search(s) is not None
        if ":" in s:
            s = _AUTH_HEADER.sub(self._header, s)
        if "-u" in s:
            s = _USER_OPTION.sub(self._user_option, s)
        s = _BEARER.sub(lambda m: f"{m.group(1)} {self._secret('bearer tokens', m['value'])}", s)
        if "eyJ" in s:
            s = _JWT.sub(lambda m: self._secret("bearer tokens", m.group(0)), s)
        s = _KNOWN_TOKENS.sub(lambda m: self._secret("access tokens", m.group(0)), s)
        if ":A" in s:
            s = _TELEGRAM.sub(lambda m: self._secret("access tokens", m.group(0)), s)
        if "eyJ" in s or "ewo" in s:
            s = _B64_JSON.sub(self._b64_json, s)
        if aws:
            s = _AWS_SECRET.sub(lambda m: self._aws_secret(m, key_id), s)
        quoted = '"' in s or "'" in s
        if quoted and "," in s and ("(" in s or "[" in s):
            s = _CRED_TUPLE.sub(self._cred_tuple, s)
        if quoted and ":" in s:
            s = _JSON_PAIR.sub(self._json_pair, s)
        return s

    def _pairs(self, s: str) -> str:
        """name: value, name:value, NAME=value, --option value, and a login/auth/token verb's positional key."""
        if ":" in s:
            s = _COLON_PAIR.sub(self._colon_pair, s)
            if _STRONG_NAME.search(s):
                s = _COLON_TIGHT.sub(self._colon_tight, s)

        def pair(m: re.Match) -> str:
            q, value = _unquote(m["value"])
            if (SECRET_NAME.search(m["name"]) and MASK not in value and not value.startswith(("(", "["))
                    and (q or value.rstrip(")]},;") not in _LITERALS) and not _XML_VALUE_NEXT.match(m.string, m.end())):
                return f"{m['name']}={q}{self._secret('secret-like NAME=value pairs', value)}{q}"
            return m.group(0)

        def option(m: re.Match) -> str:
            q, value = _unquote(m["value"])
            if (SECRET_NAME.search(m["opt"].lstrip("-").replace("-", "_")) and value != MASK
                    and not (m["value"].startswith("-") and not q)):
                return f"{m['opt']}{m['sep']}{q}{self._secret('secret-like command-line options', value)}{q}"
            return m.group(0)

        if "=" in s:
            s = _ENV_PAIR.sub(pair, s)
        if "-" in s:
            s = _OPTION_PAIR.sub(option, s)
        if "login" in s or "auth" in s or "token" in s:
            s = _VERB_ARG.sub(self._verb_arg, s)
        return s

    def _yaml_blocks(self, s: str) -> str:
        """Each YAML block scalar under a secret-like key: its lines (those indented deeper than the key, and blank
        ones) masked one by one, their indentation kept."""
        out, at = [], 0
        for m in _YAML_BLOCK_HEAD.finditer(s):
            if m.start() < at or not SECRET_NAME.search(m["name"]):
                continue
            depth, pos = _line_indent(s, m.start()), m.end()
            out.append(s[at:pos])
            while pos < len(s):
                end = s.find("\n", pos)
                end = len(s) if end < 0 else end + 1
                line = s[pos:end]
                content = line.strip()
                if content and len(line) - len(line.lstrip(" \t")) <= depth:
                    break
                lead, tail = line[:len(line) - len(line.lstrip(" \t"))], line[len(line.rstrip()):]
                out.append(line if not content or MASK in content
                           else lead + self._secret("secret-like YAML block scalars", content) + tail)
                pos = end
            at = pos
        return "".join(out) + s[at:] if out else s

    def _b64_json(self, m: re.Match) -> str:
        """Base64 of a JSON object: masked whole when what it decodes to holds a secret."""
        import binascii

        v = m.group(0)
        body = v.replace("-", "+").replace("_", "/").rstrip("=")
        try:
            text = binascii.a2b_base64(body + "=" * (-len(body) % 4)).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return v
        if not text.lstrip().startswith("{") or Redactor().text(text) == text:
            return v
        return self._secret("base64-encoded credentials", v)

    def _aws_secret(self, m: re.Match, key_id: bool) -> str:
        v = m.group(0)
        mixed = any(c.isupper() for c in v) and any(c.islower() for c in v) and any(c.isdigit() for c in v)
        if mixed and (key_id or "/" in v or "+" in v):
            return self._secret("AWS secret access keys", v)
        return v

    def _cred_tuple(self, m: re.Match) -> str:
        name, value = m["name"].rsplit(".", 1)[-1], m["value"]
        if MASK in value or not (SECRET_NAME.search(name) or name.lower() in _LOGIN_NAMES):
            return m.group(0)
        return self._mask_value(m, "credential tuples")

    def _colon_tight(self, m: re.Match) -> str:
        if MASK in m["value"] or not _STRONG_NAME.search(m["name"]):
            return m.group(0)
        return self._mask_value(m, "secret-like name:value pairs")

    def _verb_arg(self, m: re.Match) -> str:
        value = m["value"]
        if MASK in value or not _random_looking(value):
            return m.group(0)
        return self._mask_value(m, "keys given to login/auth/token commands")

    def _private_key(self, m: re.Match) -> str:
        # its lines are learned one by one too: a quote of memory or a log line may hold one line of the block
        self.secrets.update(ln.strip() for ln in m.group(0).splitlines()
                            if len(ln.strip()) >= MIN_SECRET_LEN and not ln.startswith("-----") and MASK not in ln)
        return self._secret("private keys", m.group(0))

    def _structures(self, s: str) -> str:
        """The rules for files and strings that join many pairs: connection strings, query strings, ini and
        YAML lines, cookies, .netrc, .pgpass, mysql -pSECRET, XML key/value attributes."""
        def named(what: str) -> Callable[[re.Match], str]:
            return lambda m: self._mask_value(m, what) if SECRET_NAME.search(m["name"]) else m.group(0)

        def plain(what: str) -> Callable[[re.Match], str]:
            return lambda m: self._mask_value(m, what)

        # each where what it matches can be (a plain substring check first: most texts need few of them)
        if "value=" in s:
            s = _XML_KEY_VALUE.sub(named("secret-like XML key/value attributes"), s)
        if "=" in s:
            s = _JOINED_PAIR.sub(self._joined_pair, s)
        if "value:" in s:
            s = _YAML_NAME_VALUE.sub(named("secret-like YAML name/value entries"), s)
        s = _LINE_PAIR.sub(named("secret-like key = value lines"), s)
        if _COOKIE_WORD.search(s):
            s = _COOKIE.sub(self._cookie, s)
        if "-b" in s or "--cookie" in s:
            s = _COOKIE_OPTION.sub(self._cookie, s)
        if "mysql" in s or "mariadb" in s:
            s = _MYSQL_P.sub(plain("mysql -p passwords"), s)
        if "-P" in s:
            s = _SQLCMD_P.sub(plain("sqlcmd -P passwords"), s)
        if "login" in s and "-p" in s:
            s = _LOGIN_P.sub(plain("login -p passwords"), s)
        if "-key" in s:
            s = _WG_KEY.sub(plain("WireGuard keys"), s)
        if "jdbc:oracle:" in s:
            s = _JDBC_ORACLE.sub(plain("passwords in JDBC URLs"), s)
        if "password" in s:
            s = _NETRC.sub(plain(".netrc passwords"), s)
        return _PGPASS.sub(plain(".pgpass passwords"), s) if s.count(":") >= 4 else s

    def _mask_value(self, m: re.Match, what: str) -> str:
        """``m``'s text with its ``value`` group masked (kept when empty or already masked)."""
        value = m["value"]
        if not value or MASK in value:
            return m.group(0)
        a, b = m.start("value") - m.start(), m.end("value") - m.start()
        return m.group(0)[:a] + self._secret(what, value) + m.group(0)[b:]

    def _joined_pair(self, m: re.Match) -> str:
        q, value = _unquote(m["value"])
        if value.startswith("{") and value.endswith("}"):
            q, value = "{", value[1:-1]
        name = m["name"]
        joined = m["sep"] is not None or m.string[m.end():m.end() + 1] in (";", "&")  # not "" (the end)
        secret = SECRET_NAME.search(name) or (joined and name.lower() in _PARAM_SECRETS)
        if not secret or not value or MASK in value or (not q and (value.startswith(("(", "["))
                                                                  or value.rstrip(")]},") in _LITERALS)) \
                or _XML_VALUE_NEXT.match(m.string, m.end()):  # auth=('u', 'p'): the credential tuple's rule
            return m.group(0)  # key="Password" value="...": the attribute names the secret, the XML rule masks it
        close = "}" if q == "{" else q
        head = m.group(0)[:m.start("value") - m.start()]
        return f"{head}{q}{self._secret('secret-like NAME=value pairs', value)}{close}"

    def _cookie(self, m: re.Match) -> str:
        def one(p: re.Match) -> str:
            if p["name"].lower() in _COOKIE_ATTRS or not p["value"] or MASK in p["value"]:
                return p.group(0)
            return f"{p['name']}={self._secret('cookie values', p['value'])}"
        return m["head"] + (m["q"] or "") + _COOKIE_PAIR.sub(one, m["body"])

    def _userinfo(self, m: re.Match) -> str:
        if m["pw"] == MASK or not m["pw"]:
            return m.group(0)
        return f"{m['scheme']}{m['user']}:{self._secret('passwords in URLs', m['pw'])}@"

    def _json_pair(self, m: re.Match) -> str:
        if not SECRET_NAME.search(m["name"]) or m["value"] in ("", MASK):
            return m.group(0)
        q, vq = m["q"], m["vq"]
        return f"{q}{m['name']}{q}: {vq}{self._secret('secret-like JSON keys', m['value'])}{vq}"

    def _colon_pair(self, m: re.Match) -> str:
        # "Authorization: Bearer x" is the header rule's; a value already masked stays
        if not SECRET_NAME.search(m["name"]) or MASK in m["value"] or m["name"].lower() in ("authorization",):
            return m.group(0)
        q = m["q"] or ""
        return f"{m['name']}{m['sep']}{q}{self._secret('secret-like name: value pairs', m['value'])}{q}"

    def _header(self, m: re.Match) -> str:
        if m["value"] == MASK:
            return m.group(0)
        return f"{m['name']}{m['sep']}{m['scheme'] or ''}{self._secret('authorization headers', m['value'])}"

    def _user_option(self, m: re.Match) -> str:
        q = m["q"] or ""
        user, pw = (m["quser"], m["qpw"]) if q else (m["user"], m["pw"])
        if pw == MASK:
            return m.group(0)
        return f"{m['opt']}{m['sep']}{q}{user}:{self._secret('user:password options', pw)}{q}"

    def facts_from(self, *trees: Any) -> None:
        """Add :func:`facts_of` each of ``trees`` to :attr:`facts` when a learned secret first needs them: facts
        only keep a learned secret from being chased, and most evidence teaches none."""
        self._facts_from += trees

    def _read_facts(self) -> None:
        if self._facts_from and self.secrets:
            trees, self._facts_from = self._facts_from, []
            for t in trees:
                self.facts |= facts_of(t)

    def _chased(self) -> list[str]:
        """The learned secrets masked wherever they appear (longest first): none shorter than
        :data:`MIN_SECRET_LEN`, none equal to one of the document's facts."""
        return sorted((v for v in self.secrets if len(v) >= MIN_SECRET_LEN and v not in self.facts),
                      key=len, reverse=True)

    def hex_quote(self, quote: str) -> str:
        """A hex quote of memory (``first_bytes``) masked as its bytes read as text (:meth:`cut_quote`).
        A masked quote is the hex of the masked text.

        >>> r = Redactor()
        >>> _ = r.text("--password hunter2hunter2")
        >>> bytes.fromhex(r.hex_quote(b"ter2hunter2\\0\\0".hex()))
        b'[REDACTED]\\x00\\x00'
        """
        try:
            raw = bytes.fromhex(quote)
        except ValueError:
            return self.cut_quote(quote)
        text = raw.decode("latin-1")
        out = self.cut_quote(text)
        return quote if out == text else out.encode("latin-1", "replace").hex()

    def cut_quote(self, text: str) -> str:
        """A quote of memory that may cut a value anywhere (the first bytes past a buffer, a str local cut at 77
        characters): masked by the rules of :meth:`text`, and wherever :data:`MIN_SECRET_LEN` or more of its
        characters in a row are part of a learned secret.

        >>> r = Redactor()
        >>> _ = r.text("--token 0123456789abcdefXYZ")
        >>> r.cut_quote("'...a long str local ending in 0123456789ab...'")
        "'...a long str local ending in [REDACTED]...'"
        """
        out = self.text(text)
        windows = self._windows()
        n, i, parts = MIN_SECRET_LEN, 0, []
        while windows and i <= len(out) - n:
            if out[i:i + n] not in windows:
                i += 1
                continue
            j = i + n
            while j < len(out) and out[j - n + 1:j + 1] in windows:
                j += 1
            self._count("secrets in quotes of memory")
            parts.append(out[:i] + MASK)
            out, i = out[j:], 0
        return "".join(parts) + out

    def _windows(self) -> frozenset[str]:
        """Every run of :data:`MIN_SECRET_LEN` characters of the chased secrets (cached until they change)."""
        self._read_facts()
        key = (len(self.secrets), len(self.facts))
        if self._window_key != key:
            n = MIN_SECRET_LEN
            self._window_set = frozenset(v[i:i + n] for v in self._chased() for i in range(len(v) - n + 1))
            self._window_key = key
        return self._window_set

    def _known_secrets(self, s: str) -> str:
        """Mask every secret value already found elsewhere (longest first)."""
        self._read_facts()
        key = (len(self.secrets), len(self.facts))
        if self._chased_key != key:
            chased = self._chased()
            self._chased_re = re.compile("|".join(map(re.escape, chased))) if chased else None
            self._chased_key = key
        if self._chased_re is None or self._chased_re.search(s) is None:
            return s  # none in it (one search, not one for each secret)
        for value in self._chased():
            if value in s:
                self.counts["repeated secret values"] = self.counts.get("repeated secret values", 0) + s.count(value)
                s = s.replace(value, MASK)
        return s

    def _hosts(self, s: str) -> str:
        names = [n for n in self.known_hosts if n]
        if names:
            s = _names_pattern(tuple(sorted(names, key=len, reverse=True))).sub(self._known_host, s)
        s = _IPV4.sub(self._ipv4, s)  # loopback stays
        s = _IPV6.sub(self._ip, s)
        s = _HOSTNAME.sub(self._hostname, s)
        return s

    def _ipv4(self, m: re.Match) -> str:
        return m.group(0) if m.group(0).startswith("127.") else self._ip(m)

    def _ip(self, m: re.Match) -> str:
        self._count("IP addresses")
        return self.alias(m.group(0), "ip")

    def _known_host(self, m: re.Match) -> str:
        name = m.group(0)
        kind = self.known_hosts[name]
        self._count(f"{kind} names")
        return self.alias(name, kind)

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
    ["com", "net", "org", "io", "ai", "dev", "cloud", "app", "co", "edu", "gov", "mil", "int", "biz", "info", "us",
     "uk", "de", "fr", "cn", "jp", "kr", "in", "ru", "nl", "eu", "ca", "au", "ch", "se", "local", "localdomain",
     "internal", "cluster", "svc", "lan", "corp", "intra", "intranet", "home", "private", "example", "test"]
)


def _names_pattern(names: tuple[str, ...]) -> re.Pattern:
    """One pattern for whole known names, longest first (one pass: an alias is never replaced again)."""
    return re.compile(_NAME_BEFORE + "(?:" + "|".join(re.escape(n) for n in names) + ")" + _NAME_AFTER)


def redact_tree(value: Any, r: Redactor, *, key: str | None = None,
                finish: Callable[[str, str | None], str] | None = None,
                argv: Callable[[str], object] | None = None) -> Any:
    """Apply ``r`` to every string in a JSON-like tree, its dict keys too; env-like dicts by their variable names.

    Kubernetes-style ``{"name": ..., "value": ...}`` entries are judged by their name, too.  The one walk of a
    report's evidence: ``finish(text, key)`` is applied to every string after its redaction (a value with
    the key it stands under; a key with None), e.g. to localize paths and escape control characters in
    the same pass; ``argv`` is given every list of strings joined by spaces (an argument vector: "--token",
    "value" in separate items).  Two keys that come out the same keep both values (`` (2)`` appended).

    >>> redact_tree({"env": [{"name": "DB_PASS", "value": "hunter2"}], "environ": {"PATH": "/bin"}}, Redactor())
    {'env': [{'name': 'DB_PASS', 'value': '[REDACTED]'}], 'environ': {'PATH': '/bin'}}
    >>> redact_tree({"--token=abc123def456": 1, "--token=zzz999yyy888": 2}, Redactor())
    {'--token=[REDACTED]': 1, '--token=[REDACTED] (2)': 2}
    """
    def done(text: str, k: str | None) -> str:
        return finish(text, k) if finish is not None else text

    def new_key(k: object, out: dict) -> object:
        if not isinstance(k, str):
            return k
        base = nk = done(r.text(k), None)
        n = 1
        while nk in out:
            n += 1
            nk = f"{base} ({n})"
        return nk

    def walk(v: Any, key: str | None) -> Any:
        if isinstance(v, str):
            if key is not None and SECRET_NAME.search(key):
                return done(r.env_value(key, v), key)
            return done(r.text(v), key)
        if isinstance(v, dict):
            out: dict = {}
            named = (isinstance(v.get("name"), str) and isinstance(v.get("value"), str)
                     and SECRET_NAME.search(v["name"]))
            for k, x in v.items():
                if named and k == "value":
                    out[new_key(k, out)] = done(r.env_value(v["name"], x), k)
                else:
                    env = isinstance(k, str) and (key in ("environ", "env", "environment") or _is_env_name(k))
                    out[new_key(k, out)] = walk(x, k if env else None) if not isinstance(x, str) or env \
                        else _leaf(r, x, k, done)
            return out
        if isinstance(v, (list, tuple)):
            if argv is not None and v and all(isinstance(x, str) for x in v):
                argv(" ".join(v))
            name = _env_pair_name(v)  # ["DB_PW", "value"]: verify-imports' environment, judged by the name
            items = [walk(x, name if i == 1 else None) for i, x in enumerate(v)]
            return items if isinstance(v, list) else tuple(items)
        return v

    return walk(value, key)


def _learn_tree(tree: Any, r: Redactor) -> None:
    """What ``redact_tree(tree, r, argv=r.text)`` learns into ``r.secrets``, without building its result, each
    distinct string read once in each of its roles.  What a string teaches depends on it alone (the rules of
    :meth:`Redactor.text` read no learned secret but to mask it, and a mask is never learned), so the order and
    the repeats of redact_tree's walk do not matter; the roles (a value under a secret-like name, a hex quote,
    a quote cut short, text) and which string stands in which are redact_tree's own."""
    _Learner(r).tree(tree)


class _Learner:
    """:func:`_learn_tree`'s walk: the strings read so far, in each role."""

    def __init__(self, r: Redactor) -> None:
        self.r = r
        self.texts: set[str] = set()
        self.named: set[tuple[str, str]] = set()
        self.env_keys: dict[Any, bool] = {}  # each key met: whether it names an environment variable (text read)
        self.dicts: set[tuple] = set()  # the dicts of strings and numbers read (a frame: 200 threads, one read)
        self.walked: set[tuple[int, bool]] = set()  # (id, under an environment key) of each dict walked, and the
        self.sequences: set[int] = set()  # id of each list walked (whatever its key): the tree holds them all while
        # it is walked, so no id is reused

    def text(self, s: str) -> None:
        if s not in self.texts:
            self.texts.add(s)
            self.r.text(s)  # a quote cut short (cut_quote) learns what text does

    def env_value(self, name: str, s: str) -> None:
        if (name, s) not in self.named:
            self.named.add((name, s))
            self.r.env_value(name, s)

    def key_env(self, k: Any) -> bool:
        """A key met the first time: its text read; whether it names an environment variable."""
        if isinstance(k, str):
            self.text(k)
        env = self.env_keys[k] = isinstance(k, str) and _is_env_name(k)
        return env

    def tree(self, tree: Any) -> None:
        stack: list[tuple[Any, str | None]] = [(tree, None)]
        while stack:
            v, key = stack.pop()
            if isinstance(v, str):
                if key is not None and SECRET_NAME.search(key):
                    self.env_value(key, v)
                else:
                    self.text(v)
            elif isinstance(v, dict):
                self.dict(v, key, stack)
            elif isinstance(v, (list, tuple)):
                if id(v) in self.sequences:  # this very list again (threads sharing a stack): nothing new
                    continue
                self.sequences.add(id(v))
                if v and all(isinstance(x, str) for x in v):
                    self.text(" ".join(v))  # an argument vector: "--token", "value" in separate items
                name = _env_pair_name(v)
                stack.extend((x, name if i == 1 else None) for i, x in enumerate(v))

    def dict(self, v: dict, key: str | None, stack: list[tuple[Any, str | None]]) -> None:
        secret_name = (isinstance(v.get("name"), str) and isinstance(v.get("value"), str)
                       and SECRET_NAME.search(v["name"]))
        in_env = key in ("environ", "env", "environment")
        if (id(v), in_env) in self.walked:  # this very dict again (a document's shared frames): nothing new
            return
        self.walked.add((id(v), in_env))
        if _seen_dict(self.dicts, v, in_env):
            return
        env_keys, texts = self.env_keys, self.texts
        for k, x in v.items():
            env = env_keys.get(k)
            if env is None:
                env = self.key_env(k)
            env = env or (in_env and isinstance(k, str))
            if secret_name and k == "value":
                self.env_value(v["name"], x)
            elif env or isinstance(x, (dict, list, tuple)):
                stack.append((x, k if env else None))
            elif not isinstance(x, str):
                continue  # a number: nothing to learn
            elif k in _HEX_KEYS:
                self.r.hex_quote(x)
            elif x not in texts:
                self.text(x)


#: how a quote cut short ends (a str local: its repr cut at 77 characters, "...")
_CUT_ENDS = ("...", "...'", '..."')
#: keys whose strings are hex quotes of memory (the heap verdict's first bytes past a buffer's end)
_HEX_KEYS = frozenset({"first_bytes"})
#: keys whose strings are a document's own facts (analyze's records: frames, libraries, the signal, versions)
_FACT_KEYS = frozenset({"signal_name", "function", "symbol", "library", "file", "executable", "command", "kind",
                        "fault_kind", "python_version", "driver_version", "version", "entry", "caller", "module",
                        "type_name"})
_SIGNALS = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGKILL", "SIGTERM", "SIGQUIT",
            "SIGXCPU", "SIGXFSZ", "SIGINT", "SIGHUP", "SIGPIPE", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGALRM")
_FACT_PARTS = re.compile(r"[.:()<>\[\],]+")
_VERSION_KEYS = frozenset({"kind", "fault_kind", "python_version", "driver_version", "version"})
_SPACE = re.compile(r"\s")  # str.isspace's characters (both are Py_UNICODE_ISSPACE)
_LEAVES = (str, int, float, bool, type(None))  # what holds no fact unless it stands under a fact key


def facts_of(tree: Any, *, limit: int = 100_000) -> set[str]:
    """The facts of a document that redaction must not erase: signal names, frame and function names and their
    dotted parts, library and file names (the last path component and its parts), versions -- the strings under
    the record keys analyze writes (at most ``limit``).  Directories are not facts: a token may be one.

    >>> f = facts_of({"frames": [{"function": "Device.nvlink_throughput", "library": "/x/libnvidia-ml.so.1"}]})
    >>> sorted(f - set(_SIGNALS))
    ['1', 'Device', 'Device.nvlink_throughput', 'libnvidia-ml', 'libnvidia-ml.so.1', 'nvlink_throughput', 'so']
    """
    out = _all_facts(tree)
    if len(out) < limit:
        return out  # what the walk below finds when the limit does not cut it short
    out = set(_SIGNALS)
    stack: list[tuple[Any, Any]] = [(tree, None)]
    while stack and len(out) < limit:
        v, key = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, k) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, key) for x in v)
        elif isinstance(v, str) and key in _FACT_KEYS:
            _add_fact(out, v, key)
    return out


def _add_fact(out: set[str], v: str, key: str) -> None:
    """The facts of one string ``v`` under the fact key ``key`` into ``out``."""
    if not v or _SPACE.search(v) is not None:
        return  # a value with a space is no name (a command line under "command"): its words may be secrets
    name = v.rstrip("/").rsplit("/", 1)[-1]
    out.add(name)
    out.update(p for p in _FACT_PARTS.split(name) if p)
    if key in _VERSION_KEYS:
        out.add(v)


def _seen_dict(seen: set[tuple], v: dict, *context: object) -> bool:
    """Whether a dict equal to ``v`` (the same items in the same order, in the same ``context``) is in ``seen``;
    ``v`` is added.  A dict holding a container is never seen (it has no hash)."""
    try:
        sig = (context, tuple(v.items()))
        if sig in seen:
            return True
        seen.add(sig)
    except TypeError:
        pass
    return False


def _all_facts(tree: Any) -> set[str]:
    """:func:`facts_of` without a limit: each distinct string read once (an analysis repeats its frames' names
    in every thread)."""
    out: set[str] = set(_SIGNALS)
    seen: set[str] = set()
    versions: set[str] = set()
    stack: list[tuple[Any, Any]] = [(tree, None)]
    while stack:
        v, key = stack.pop()
        if isinstance(v, dict):
            items: Iterable[tuple[Any, Any]] = v.items()
        elif isinstance(v, (list, tuple)):
            items = ((key, x) for x in v)
        else:
            items = ((key, v),)
        for k, x in items:
            if isinstance(x, str):
                if k not in _FACT_KEYS:
                    continue
                if k in _VERSION_KEYS and x not in versions:
                    versions.add(x)
                    _add_fact(out, x, k)
                elif x not in seen:
                    seen.add(x)
                    _add_fact(out, x, "")
            elif isinstance(x, (dict, list, tuple)):
                stack.append((x, k))
    return out


def redact_document(doc: Any, r: Redactor | None = None, *, learn_from: Any = None) -> Any:
    """A JSON document as it may leave the process: its secrets learned from the whole of it, then masked
    everywhere (:func:`redact_tree`), its own facts kept (:func:`facts_of`).  A dict gets a ``redaction``
    member: what was masked (``counts``) and under which title or signature keys (``masked_in``).

    >>> d = redact_document({"args": "exporter --api-key s3cr3tvalue1", "signature": "crash in thread s3cr3tvalue1"})
    >>> d["args"], d["signature"], d["redaction"]["masked_in"]
    ('exporter --api-key [REDACTED]', 'crash in thread [REDACTED]', ['signature'])
    """
    r = r if r is not None else Redactor()
    before = None
    if isinstance(doc, dict) and "redaction" in doc:  # an earlier pass's account (kept, added to)
        before, doc = doc["redaction"], {k: v for k, v in doc.items() if k != "redaction"}
    r.facts_from(doc, learn_from)
    r.learn(doc if learn_from is None else [doc, learn_from])  # learn_from: what the document was made of
    out = redact_tree(doc, r)
    if isinstance(out, dict):
        counts, masked_in = dict(r.counts), set(r.masked_in)
        if isinstance(before, dict):
            for what, n in (before.get("counts") or {}).items():
                if isinstance(n, int):
                    counts[str(what)] = counts.get(str(what), 0) + n
            masked_in |= {str(k) for k in before.get("masked_in") or () if str(k) in TITLE_KEYS}
        out["redaction"] = {"counts": dict(sorted(counts.items())), "masked_in": sorted(masked_in)}
    return out


# a text renderer's quote of memory: "first bytes:     68 75 6e 74  |hunt|" (text/heap.py)
_HEX_LINE = re.compile(r"(?P<head>first bytes:\s+)(?P<hex>[0-9a-f]{2}(?: [0-9a-f]{2})*)(?P<mid>\s+\|).*\|$")


def redact_lines(lines: Iterable[str], doc: Any) -> Iterator[str]:
    """A text rendering's lines with the secrets of ``doc`` (the same result as a JSON document) masked: each
    learned from the whole document, its facts kept (:func:`redact_document`'s rules); a quote of memory is
    masked in its hex and its characters alike.

    >>> list(redact_lines(["args: x --api-key s3cr3tvalue1", "thread s3cr3tvalue1",
    ...                    "first bytes:     68 75 6e 74 65 72 32 32 32  |hunter222|"],
    ...                   {"args": "x --api-key s3cr3tvalue1 --password hunter222"}))[1:]
    ['thread [REDACTED]', 'first bytes:     5b 52 45 44 41 43 54 45 44 5d  |[REDACTED]|']
    """
    r = Redactor()
    r.facts_from(doc)
    r.learn(doc)
    for line in lines:
        m = _HEX_LINE.search(line)
        if m is None:
            yield r.text(line)
            continue
        raw = bytes.fromhex(r.hex_quote(m["hex"].replace(" ", "")))
        shown = "".join(chr(b) if 32 <= b < 127 else "." for b in raw)
        yield r.text(line[:m.start()]) + f"{m['head']}{raw.hex(' ')}{m['mid']}{shown}|"


def masked_titles(tree: Any, *, limit: int = 100_000) -> set[str]:
    """The :data:`TITLE_KEYS` of ``tree`` whose strings hold a mask: a title or signature a secret was cut out of,
    by this redaction or an earlier one (an analysis redacted where it was written).

    >>> sorted(masked_titles({"analysis": {"signature": "crash in thread [REDACTED]"}, "title": "x"}))
    ['signature']
    """
    out: set[str] = set()
    stack: list[Any] = [tree]
    while stack and limit > 0:
        limit -= 1
        v = stack.pop()
        if isinstance(v, dict):
            out.update(k for k, x in v.items() if k in TITLE_KEYS and isinstance(x, str) and MASK in x)
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return out


def _leaf(r: Redactor, x: str, k: str, done: Callable[[str, str | None], str]) -> str:
    """One string of a tree under key ``k``: a hex quote of memory, a title (a mask there is noted), or text."""
    if k in _HEX_KEYS:
        return done(r.hex_quote(x), k)
    out = r.cut_quote(x) if x.endswith(_CUT_ENDS) else r.text(x)
    if k in TITLE_KEYS and out != x:
        r.masked_in.add(k)
    return done(out, k)


def _env_pair_name(v: list | tuple) -> str | None:
    """The variable's name of a ``[NAME, value]`` pair (an environment as a list of pairs), or None."""
    if len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], str) and _is_env_name(v[0]):
        return v[0]
    return None


def _is_env_name(k: str) -> bool:
    return k.isupper() and bool(re.fullmatch(r"[A-Z_][A-Z0-9_]*", k))


class StreamRedactor:
    r""":class:`Redactor` over a text too large to hold whole (NVIDIA's bug report: tens of megabytes),
    fed in pieces: each call masks the whole lines it has, with the rules of :meth:`Redactor.text` (a YAML
    ``name:`` line waits for the ``value:`` line that may follow it).

    What spans pieces is carried, bounded: a private-key block cut by a piece's end is masked on
    into the next pieces up to its END line (at most :attr:`MAX_KEY_BLOCK` characters: a real key
    block is a few KiB; past that the text is read as text again); the secret values found, to be
    masked wherever they appear later, at most :attr:`MAX_CARRIED` of them (the most recent); a line
    of more than :attr:`MAX_LINE` characters, cut there.

    >>> s = StreamRedactor()
    >>> s.feed("url=https://u:hunter22@h/x\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpQIB") + s.feed("AAKCAQ\nabc\n"
    ...     "-----END RSA PRIVATE KEY-----\nagain hunter22\n") + s.close()
    'url=https://u:[REDACTED]@h/x\n[REDACTED]\nagain [REDACTED]\n'
    >>> sorted(s.counts)
    ['passwords in URLs', 'private keys', 'repeated secret values']
    """

    MAX_CARRIED = 256
    MAX_KEY_BLOCK = 64 << 10
    MAX_LINE = 1 << 20  # a longer "line" (binary noise, a file of zeros) is masked in pieces of this size

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        """:param secrets: values to mask wherever they appear, from the start (a captured process's)"""
        self.counts: dict[str, int] = {}
        self._seeds = frozenset(sorted(secrets)[:self.MAX_CARRIED])  # kept for good, unlike what is found on the way
        self._secrets: list[str] = []
        self._partial = ""  # the unfinished last line of the previous piece
        self._in_key = 0  # characters of a private-key block masked since its BEGIN (0: not in one)
        self._block: int | None = None  # the indentation of a secret-like YAML block scalar the last piece ended in

    def feed(self, text: str) -> str:
        """The whole lines of ``self``'s remainder + ``text``, redacted; an unfinished last line waits."""
        text = self._partial + text
        cut = text.rfind("\n") + 1
        last = text.rfind("\n", 0, max(cut - 1, 0)) + 1
        if cut and (_YAML_NAME_LINE.match(text, last) or text.endswith("\\\n", 0, cut)
                    or _YAML_BLOCK_HEAD.search(text, last, cut)):
            cut = last  # YAML's "- name: DB_PASSWORD" waits for its "value: ..." line, a block scalar's head for its
            # first line, a line continued ("...\\") for the next
        if len(text) - cut > self.MAX_LINE:
            cut = len(text)
        self._partial = text[cut:]
        return self._redact(text[:cut])

    def close(self) -> str:
        """The last, unfinished line, redacted."""
        rest, self._partial = self._partial, ""
        return self._redact(rest)

    def _redact(self, text: str) -> str:
        if not text:
            return text
        if self._in_key:
            end = _KEY_END.search(text)
            if end is None and self._in_key + len(text) <= self.MAX_KEY_BLOCK:
                self._in_key += len(text)
                return ""  # still inside the block (masked where it began)
            if end is not None:
                text = text[end.end():]
            self._in_key = 0
        head = ""
        if self._block is not None:  # the lines of a block scalar the previous piece ended in
            head, text = self._block_lines(text)
        begins = list(_KEY_BEGIN.finditer(text))
        if begins and _KEY_END.search(text, begins[-1].end()) is None:
            self._in_key = len(text) - begins[-1].start()  # the last block goes on into the next piece
        r = Redactor(secrets=set(self._secrets) | self._seeds)
        out = head + r.text(text)
        self._block = _open_block(text)
        for what, n in r.counts.items():
            self.counts[what] = self.counts.get(what, 0) + n
        self._secrets += [v for v in r.secrets if v not in self._secrets and v not in self._seeds]
        del self._secrets[:-self.MAX_CARRIED]
        return out

    def _block_lines(self, text: str) -> tuple[str, str]:
        """(the leading lines of ``text`` still inside the block scalar, masked; the rest)."""
        depth, pos, out = self._block or 0, 0, []
        while pos < len(text):
            end = text.find("\n", pos)
            end = len(text) if end < 0 else end + 1
            line = text[pos:end]
            content = line.strip()
            if content and len(line) - len(line.lstrip(" \t")) <= depth:
                self._block = None
                break
            lead, tail = line[:len(line) - len(line.lstrip(" \t"))], line[len(line.rstrip()):]
            out.append(lead + MASK + tail if content else line)
            if content:
                self.counts["secret-like YAML block scalars"] = self.counts.get("secret-like YAML block scalars", 0) + 1
                if len(content) >= MIN_SECRET_LEN:
                    self._secrets.append(content)
            pos = end
        return "".join(out), text[pos:]
