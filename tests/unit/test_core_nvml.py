"""NVML version parsing and abort-message decoding (pure functions)."""
from __future__ import annotations

import pytest

from forensics.core.libc import is_libc, parse_abort_message
from forensics.core.nvml import find_driver_version_string, is_nvml, parse_driver_version_from_name


@pytest.mark.parametrize(
    "path,version",
    [
        ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.126.09", "580.126.09"),
        ("/usr/lib64/libnvidia-ml.so.535.104.05", "535.104.05"),
        ("/usr/lib64/libnvidia-ml.so.550.54", "550.54"),
        ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", None),
        ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so", None),
    ],
)
def test_parse_driver_version_from_name(path, version):
    assert parse_driver_version_from_name(path) == version


def test_is_nvml():
    assert is_nvml("/usr/lib/libnvidia-ml.so.1")
    assert not is_nvml("/usr/lib/libnvidia-mlx.so")
    assert not is_nvml("/usr/lib/libcuda.so.1")


def test_version_string_near_nvidia():
    blob = b"\x00" * 1000 + b"GCC 12.2.0\x00" + b"\x00" * 600 + b"NVIDIA NVML 565.57.01\x00" + b"\x00" * 100
    assert find_driver_version_string(blob) == "565.57.01"


def test_version_string_before_nvidia_and_two_part():
    assert find_driver_version_string(b"version 550.54 (NVIDIA Corporation)") == "550.54"


def test_version_string_ignores_versions_far_from_nvidia_and_longer_numbers():
    assert find_driver_version_string(b"580.126.09" + b"\x00" * 400 + b"NVIDIA") is None
    assert find_driver_version_string(b"NVIDIA 1.2.3.4 10.0.19041.1 2580.12") is None
    assert find_driver_version_string(b"no vendor here 580.126.09") is None


def test_version_string_search_is_bounded():
    blob = b"\x00" * 2048 + b"NVIDIA 580.126.09"
    assert find_driver_version_string(blob, limit=1024) is None
    assert find_driver_version_string(blob, limit=4096) == "580.126.09"


def test_most_frequent_version_wins():
    blob = b"NVIDIA 100.10 " + b"\x00" * 600 + (b"NVIDIA 580.126.09" + b"\x00" * 600) * 2
    assert find_driver_version_string(blob) == "580.126.09"


@pytest.mark.parametrize(
    "raw,text",
    [
        (b"double free or corruption (!prev)\n\x00", "double free or corruption (!prev)"),
        (b"free(): invalid next size (normal)\n\x00\x00garbage", "free(): invalid next size (normal)"),
        (b"python3: x.c:3: main: Assertion `0' failed.\n", "python3: x.c:3: main: Assertion `0' failed."),
        (b"\xff\xfe bad utf-8\n", "\ufffd\ufffd bad utf-8"),
    ],
)
def test_parse_abort_message(raw, text):
    assert parse_abort_message(raw) == text


def test_is_libc():
    assert is_libc("/lib/x86_64-linux-gnu/libc.so.6")
    assert is_libc("/lib/libc-2.31.so")
    assert not is_libc("/lib/libcrypt.so.1")
    assert not is_libc("/lib/libcap.so.2")
