"""AppConfig bounds: every number has a documented ceiling, every refusal names its field.

The BOUNDS table is the one in docs/security.md; a config either passes and stays
inside it or is refused with InvalidConfig — never another exception.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ground.appconfig import MAX_ENV_BYTES, AppConfig, InvalidConfig, parse, patched, plain
from ground.hostnames import BadHost, normalize_host

# field path -> (lowest accepted, highest accepted, lower bound inclusive)
BOUNDS: dict[str, tuple[float, float, bool]] = {
    "guest.cpus": (0.01, 64, True),
    "guest.memory_mb": (1, 262_144, True),
    "port": (0, 65_535, True),  # 0: the image's port
    "min_machines_running": (0, 1000, True),
    "max_machines": (1, 1000, True),
    "concurrency.soft_limit": (1, 10_000, True),
    "concurrency.hard_limit": (1, 10_000, True),
    "idle_timeout_s": (0.001, 86_400, True),
    "hold_timeout_s": (0.001, 3600, True),
    "max_pending": (0, 100_000, True),
    "spares": (0, 100, True),
    "health.interval_s": (0.001, 3600, True),
    "health.timeout_s": (0.001, 3600, True),
    "health.grace_s": (0, 3600, True),
    "kill_timeout_s": (0.001, 300, True),
    "version": (0, 2**53, True),
}
INTEGERS = {"guest.memory_mb", "port", "min_machines_running", "max_machines",
            "concurrency.soft_limit", "concurrency.hard_limit", "max_pending", "spares",
            "version"}


def config_with(path: str, value: Any, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "app", "image": "registry.example.com/app:v1",
                            "concurrency": {"soft_limit": 1, "hard_limit": 10_000}, **extra}
    *parents, leaf = path.split(".")
    node = body
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return body


def refused_field(body: dict[str, Any]) -> str:
    with pytest.raises(InvalidConfig) as caught:
        parse(body)
    return caught.value.field


@pytest.mark.parametrize("path", sorted(BOUNDS))
def test_each_numeric_field_past_its_bound_is_refused_naming_the_field(path: str) -> None:
    low, high, inclusive = BOUNDS[path]
    assert refused_field(config_with(path, high + 1)) == path
    too_low = (low / 2 if 0 < low < 1 else low - 1) if inclusive else low
    assert refused_field(config_with(path, too_low)) == path
    if path not in INTEGERS and low > 0:  # a tiny positive number is no way past the floor
        assert refused_field(config_with(path, 1e-300)) == path
    huge = 10**26 if path in INTEGERS else 1e308
    assert refused_field(config_with(path, huge)) == path


@pytest.mark.parametrize("path", sorted(BOUNDS))
def test_each_numeric_field_at_its_bound_is_accepted(path: str) -> None:
    low, high, inclusive = BOUNDS[path]
    extra = {"max_machines": 1000} if path == "min_machines_running" else {}
    parse(config_with(path, high, **extra))
    if inclusive:
        parse(config_with(path, low, **extra))


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "Bad_Name"}, "name"),
    ({"name": "ends-"}, "name"),
    ({"image": "127.0.0.1:5000//x"}, "image"),
    ({"image": "x" * 2000}, "image"),
    ({"regions": []}, "regions"),
    ({"regions": ["r"] * 17}, "regions"),
    ({"regions": ["Not A Region"]}, "regions"),
    ({"env": {f"K{i}": "v" for i in range(129)}}, "env"),
    ({"env": {"A": "x" * (MAX_ENV_BYTES + 1)}}, "env"),
    ({"env": {"A": "x" * 40_000, "B": "y" * 40_000}}, "env"),
    ({"env": {"bad name": "v"}}, "env"),
    ({"env": {"PORT": "1"}}, "env"),
    ({"env": {"THAW_APP": "x"}}, "env"),
    ({"env": {"A": "nul\0byte"}}, "env"),
    ({"hosts": ["h.example.com"] * 33}, "hosts"),
    ({"hosts": ["*.example.com"]}, "hosts"),
    ({"hosts": ["127.0.0.1"]}, "hosts"),
    ({"hosts": ["a_b.example.com"]}, "hosts"),
    ({"health": {"path": "/x HTTP/1.1\r\nHost: evil"}}, "health.path"),
    ({"health": {"path": "no-slash"}}, "health.path"),
    ({"kill_signal": "SIGNOPE"}, "kill_signal"),
    ({"image_digest": "md5:abc"}, "image_digest"),
    ({"unknown_field": 1}, "unknown_field"),
])
def test_strings_lists_and_maps_out_of_bounds_are_refused_naming_the_field(
    body: dict[str, Any], field: str
) -> None:
    base = {"name": "app", "image": "registry.example.com/app:v1", **body}
    assert refused_field(base) == field


def test_nan_and_infinity_are_refused_from_a_toml_style_dict() -> None:
    for value in (math.nan, math.inf, -math.inf):
        assert refused_field(config_with("hold_timeout_s", value)) == "hold_timeout_s"


def test_a_body_nested_100k_deep_is_refused_not_crashed() -> None:
    deep = b'{"name": "app", "image": "x", "env": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(InvalidConfig):
        parse(deep)


# full-width letters, the ideographic and the full-width full stop, as escapes
@pytest.mark.parametrize("spelling", ["www.example.com", "WWW.EXAMPLE.COM.",
                                      "www.example.com\u3002", "\uff57\uff57\uff57.example.com",
                                      "www\uff0eexample\uff0ecom\uff0e"])
def test_every_spelling_of_one_name_normalises_to_the_same_text(spelling: str) -> None:
    assert normalize_host(spelling) == "www.example.com"


def test_host_names_are_normalised_lower_case_without_trailing_dot_and_as_idna() -> None:
    config = parse({"name": "app", "image": "img",
                    "hosts": ["WWW.Example.COM.", "www.example.com", "Bücher.example"]})
    assert config.hosts == ["www.example.com", "xn--bcher-kva.example"]
    assert patched(config, {"hosts": ["Other.Example"]}).hosts == ["other.example"]


@pytest.mark.parametrize("name", ["", ".", "*.a.com", "a..b", "1.2.3.4", "[::1]", "a.com:80",
                                  "-a.com", "a" * 64 + ".com", "1.2.3", "www.example.com..",
                                  "www.example.com\u3002\u3002", "a..", ".."])
def test_names_that_cannot_route_an_app_are_refused(name: str) -> None:
    with pytest.raises(BadHost):
        normalize_host(name)


# -- property: whatever is decoded passes within bounds, or is refused naming a field ------

FIELDS = [f for f in AppConfig.__struct_fields__] + ["guest", "health", "concurrency"]
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
nested = st.fixed_dictionaries({}, optional={
    "cpus": values, "memory_mb": values, "soft_limit": values, "hard_limit": values,
    "type": values, "path": values, "interval_s": values, "timeout_s": values,
    "grace_s": values})
configs = st.fixed_dictionaries(
    {"name": st.sampled_from(["app", "a-b", "Bad", ""]),
     "image": st.sampled_from(["img", "registry.example.com/a:v1", "oci:/x:v1", "", "a//b"])},
    optional={field: values | nested for field in FIELDS if field not in ("name", "image")},
)


def within_bounds(config: AppConfig) -> bool:
    for path, (low, high, inclusive) in BOUNDS.items():
        value: Any = config
        for part in path.split("."):
            value = getattr(value, part)
        if not (low <= value <= high) or (not inclusive and value == low):
            return False
    return (config.min_machines_running <= config.max_machines
            and config.concurrency.soft_limit <= config.concurrency.hard_limit
            and len(config.hosts) <= 32 and len(config.env) <= 128)


@settings(max_examples=400, deadline=None)
@given(configs)
def test_any_decoded_config_is_within_bounds_or_refused_naming_a_field(body: dict[str, Any]
                                                                      ) -> None:
    try:
        config = parse(body)
    except InvalidConfig as exc:
        assert exc.field
        return
    assert within_bounds(config)


def test_an_unknown_field_whose_name_holds_a_backtick_is_named_with_its_path() -> None:
    # found by the fuzz above: msgspec quotes the name as it is, backticks and all
    from ground.appconfig import field_of

    assert field_of("Object contains unknown field ``` - at `$.guest`") == "guest.`"
    assert field_of("Object contains unknown field `a`b`") == "a`b"


@pytest.mark.parametrize(("body", "field", "reason"), [
    ({"max_machines": 0}, "max_machines", "must be at least 1"),
    ({"max_machines": "3"}, "max_machines", "must be an integer, not a string"),
    ({"guest": {"cpus": 100}}, "guest.cpus", "must be at most 64.0"),
    ({"regions": []}, "regions", "must be at least 1 items"),
    ({"deploy": {"strategy": "nope"}}, "deploy.strategy",
     "must be one of canary, immediate, rolling, not 'nope'"),
    ({"guest": {"cpu": 1}}, "guest.cpu", "is not a field here; did you mean `cpus`?"),
])
def test_a_refusal_says_what_the_field_must_be_in_words_not_the_decoders(
    body: dict[str, object], field: str, reason: str
) -> None:
    """`thaw scale max 0` said ``Expected `int` >= 1 - at `$.max_machines` ``."""
    with pytest.raises(InvalidConfig) as refused:
        parse({"name": "a", "image": "x", **body})
    assert (refused.value.field, refused.value.reason) == (field, reason)
    assert "`$" not in str(refused.value) and "Expected" not in str(refused.value)


def test_a_message_the_translation_does_not_know_stays_as_it_is() -> None:
    assert plain("Something new - at `$.x`") == "Something new"
    assert plain("Expected `int` >= 1 - at `$.max_machines`") == "must be at least 1"


def test_a_protocol_is_http1_or_h2c_and_an_h2c_app_may_have_a_health_path() -> None:
    base = {"name": "rpc", "image": "example/rpc:v1"}
    assert parse(base).protocol == "http1"
    config = parse({**base, "protocol": "h2c", "health": {"path": "/grpc.health.v1.Health/Check"}})
    assert (config.protocol, config.health.path) == ("h2c", "/grpc.health.v1.Health/Check")
    assert refused_field({**base, "protocol": "h3"}) == "protocol"
