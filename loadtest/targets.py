"""The servers under test: parsing --base-url / --target, the loopback rule, model discovery.

Traffic goes only to these URLs. A host that is not loopback (127.0.0.0/8, ::1, localhost) is
refused unless --allow-remote, so a typo cannot aim a load test at someone else's machine. No
DNS lookup is made for the check: "localhost" is accepted by name, every other name is remote.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx


@dataclass(frozen=True)
class Target:
    name: str  # label in tables, plots and JSON
    base_url: str  # e.g. http://127.0.0.1:8000/v1, without a trailing slash


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str, allow_remote: bool) -> str:
    """Return the URL without a trailing slash, or raise ValueError saying what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL with a host")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: a base URL has no query or fragment")
    if not allow_remote and not is_loopback(parts.hostname):
        raise ValueError(f"{url!r}: host {parts.hostname!r} is not loopback; pass --allow-remote to load-test it")
    return url.rstrip("/")


def parse_targets(base_url: str | None, target_specs: tuple[str, ...], allow_remote: bool) -> list[Target]:
    """--base-url gives one target named "server"; each --target is "name=url"."""
    if (base_url is None) == (not target_specs):
        raise ValueError("give either --base-url or one or more --target name=url")
    if base_url is not None:
        return [Target("server", check_url(base_url, allow_remote))]
    targets: list[Target] = []
    for spec in target_specs:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url:
            raise ValueError(f"--target {spec!r}: expected name=url")
        if any(t.name == name for t in targets):
            raise ValueError(f"--target name {name!r} is used twice")
        targets.append(Target(name, check_url(url, allow_remote)))
    return targets


def first_model(target: Target, api_key: str | None, timeout_s: float) -> str:
    """The first id from GET {base_url}/models, as vllm bench serve does without --model."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{target.base_url}/models", headers=headers, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as exc:
        raise ValueError(f"{target.name}: GET {target.base_url}/models failed: {exc}") from None
    if response.status_code != 200:
        raise ValueError(
            f"{target.name}: GET {target.base_url}/models answered {response.status_code}: {response.text[:200]}"
        )
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"{target.name}: GET {target.base_url}/models has no model id; pass --model") from None
