"""tito-rl: the trainer's side of a tito gateway.

`Client` / `AsyncClient`: trajectories for agents (`new_trajectory(group=...)
.base_url`), rewards, finish, metadata, the replay check, exactly-once export
batches (`batches(consumer=..., layout="verl", batch_size=...)`), weight
updates, health and fleet status. Framework integrations import their
framework only when used: `tito.verl`, `tito.slime`, `tito.areal`,
`tito.torch`, `tito.datasets`."""

from ._ops import TitoWarning
from .batch import Batch, read_parquet, to_verl
from .client import AsyncClient, Client, Trajectory
from .errors import (
    APIError,
    AuthenticationError,
    BadGatewayError,
    BadRequestError,
    ConflictError,
    CursorExpiredError,
    GatewayTimeoutError,
    IncompatibleGatewayError,
    NoSampleError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    ServiceUnavailableError,
    TitoConnectionError,
    TitoError,
    UnprocessableEntityError,
)
from .schema import EXPORT_SCHEMA_VERSIONS, PACKAGE_VERSION

__version__ = PACKAGE_VERSION

__all__ = [
    "APIError", "AsyncClient", "AuthenticationError", "BadGatewayError", "BadRequestError",
    "Batch", "Client", "ConflictError", "CursorExpiredError", "EXPORT_SCHEMA_VERSIONS",
    "GatewayTimeoutError", "IncompatibleGatewayError", "NoSampleError", "NotFoundError",
    "PayloadTooLargeError", "PermissionDeniedError", "RateLimitError", "ServerError",
    "ServiceUnavailableError", "TitoConnectionError", "TitoError", "TitoWarning", "Trajectory",
    "UnprocessableEntityError", "__version__", "read_parquet", "to_verl",
]
