"""The export schema this package reads, and the check that a gateway
serves it.

A gateway names its export schema in the response header
`X-Export-Schema-Version` of `GET /v1/export`. A gateway that sends no such
header is read by its columns: every column this package reads must be
there, with the Arrow type it expects."""

from __future__ import annotations

import pyarrow as pa

from .errors import IncompatibleGatewayError

#: The package's version, released together with the gateway's.
PACKAGE_VERSION = "0.1.0"

#: Export schema versions this package reads.
EXPORT_SCHEMA_VERSIONS: tuple[str, ...] = ("1",)

SCHEMA_HEADER = "x-export-schema-version"

_I32 = pa.list_(pa.int32())
_F32 = pa.list_(pa.float32())
_STR_LIST = pa.list_(pa.string())

# Provenance columns every layout carries (docs/export.md).
_PROVENANCE: dict[str, pa.DataType] = {
    "weight_version": pa.string(),
    "weight_versions": _STR_LIST,
    "call_offsets": _I32,
    "min_weight_version": pa.string(),
    "max_weight_version": pa.string(),
    "finish_reason": pa.string(),
    "truncated": pa.bool_(),
}

_TRAJECTORY: dict[str, pa.DataType] = {
    "trajectory_id": pa.string(),
    "sample": pa.int32(),
    "prompt_ids": _I32,
    "response_ids": _I32,
    "response_mask": _I32,
    "response_logprobs": _F32,
    "reward": pa.float64(),
    "reward_extra_info": pa.string(),
    "num_turns": pa.int32(),
    "group": pa.string(),
    "data_source": pa.string(),
    "index": pa.int64(),
    "extra_info": pa.string(),
    **_PROVENANCE,
}

_VERL: dict[str, pa.DataType] = {
    "prompts": _I32,
    "responses": _I32,
    "response_mask": _I32,
    "input_ids": _I32,
    "attention_mask": _I32,
    "position_ids": _I32,
    "rollout_log_probs": _F32,
    "rm_scores": _F32,
    "uid": pa.string(),
    "data_source": pa.string(),
    "index": pa.int64(),
    "extra_info": pa.string(),
    "reward_extra_info": pa.string(),
    "__num_turns__": pa.int32(),
    "trajectory_id": pa.string(),
    "sample": pa.int32(),
    "reward": pa.float64(),
    **_PROVENANCE,
}

#: Column -> Arrow type, per layout, of export schema version 1.
COLUMNS: dict[str, dict[str, pa.DataType]] = {
    "trajectory": _TRAJECTORY,
    "per_call": {**_TRAJECTORY, "call": pa.int32()},
    "verl": _VERL,
}


def _same(got: pa.DataType, want: pa.DataType) -> bool:
    """Type equality that ignores list element names and nullability
    (Parquet writers name the element `item` or `element`)."""
    if pa.types.is_list(want) or pa.types.is_large_list(want):
        return bool((pa.types.is_list(got) or pa.types.is_large_list(got))
                    and _same(got.value_type, want.value_type))
    if pa.types.is_string(want):
        return bool(pa.types.is_string(got) or pa.types.is_large_string(got))
    return bool(got.equals(want))


def check(schema: pa.Schema, layout: str, header: str | None,
          gateway_version: str | None) -> None:
    """Raises `IncompatibleGatewayError` unless the export page's schema
    (its `X-Export-Schema-Version` header, else its columns) is one this
    package reads. `gateway_version` is named in the message."""
    named = f"tito gateway {gateway_version or '(version unknown)'}"
    ours = (f"tito-rl {PACKAGE_VERSION} reads export schema "
            f"{', '.join(EXPORT_SCHEMA_VERSIONS)}")
    if header is not None:
        if header.strip() not in EXPORT_SCHEMA_VERSIONS:
            raise IncompatibleGatewayError(
                f"{named} serves export schema {header.strip()}; {ours}: "
                "install the tito-rl release of the gateway's version",
                gateway_version=gateway_version, schema_version=header.strip())
        return
    wanted = COLUMNS.get(layout)
    if wanted is None:
        raise ValueError(f"unknown layout {layout!r}: one of {', '.join(COLUMNS)}")
    problems = []
    for name, typ in wanted.items():
        idx = schema.get_field_index(name)
        if idx < 0:
            problems.append(f"no column `{name}`")
        elif not _same(schema.field(idx).type, typ):
            problems.append(f"`{name}` is {schema.field(idx).type}, expected {typ}")
    if problems:
        raise IncompatibleGatewayError(
            f"{named} names no export schema version and its `{layout}` export does not "
            f"match schema 1 ({'; '.join(problems)}); {ours}",
            gateway_version=gateway_version, schema_version=None)
