"""Request bodies: protobuf (zstd-compressed or not) and JSON forward_backward bodies into
datums, with a bound on what a body may decompress to."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zstandard
from tinker.proto import tinker_public_pb2 as pb

# A 32 KB zstd body can expand to 1 GB: nothing beyond this is decompressed or parsed.
MAX_BODY_BYTES = 64 * 1024 * 1024
PROTO_CONTENT_TYPE = "application/x-protobuf"
_PROTO_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64}
_JSON_DTYPES = {"float32": np.float32, "int64": np.int64}


class WireError(Exception):
    """A body the service refuses: `status` (400, 413, 415) and a message for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class ForwardBackwardBody:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float] | None
    forward_only: bool
    # Per datum: `input_ids` and the loss inputs (`target_tokens`, `weights`, ...), 1-D.
    datums: list[dict[str, np.ndarray]] = field(default_factory=list)


def decompressed(body: bytes, content_encoding: str | None, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, zstd-decompressed when it says so; more than `limit` bytes is a 413."""
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        if len(body) > limit:
            raise WireError(413, f"the body has {len(body)} bytes; at most {limit} are taken")
        return body
    if encoding != "zstd":
        raise WireError(415, f"Content-Encoding {content_encoding!r}: only zstd is taken")
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(body)
        data = reader.read(limit + 1)
    except zstandard.ZstdError as err:
        raise WireError(400, f"the zstd body does not decompress: {err}") from None
    if len(data) > limit:
        raise WireError(413, f"the body decompresses to more than {limit} bytes")
    return data


def parse_forward_backward(raw: bytes, content_type: str | None) -> ForwardBackwardBody:
    """A forward_backward body as the SDK sends it (protobuf) or as JSON."""
    if PROTO_CONTENT_TYPE in (content_type or ""):
        return _from_proto(raw)
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise WireError(400, f"the body is neither protobuf nor JSON: {err}") from None
    try:
        return _from_json(document)
    except (KeyError, TypeError, ValueError) as err:
        raise WireError(400, f"the forward_backward JSON body is malformed: {err!r}") from None


def _from_proto(raw: bytes) -> ForwardBackwardBody:
    message = pb.ForwardBackwardRequest()
    try:
        message.ParseFromString(raw)
    except Exception as err:  # protobuf's DecodeError and kin
        raise WireError(400, f"the protobuf body does not parse: {err}") from None
    config = {k: v.number for k, v in message.loss_fn_config_v2.items() if v.HasField("number")}
    config = config or dict(message.loss_fn_config) or None
    datums = [_proto_datum(index, datum) for index, datum in enumerate(message.data)]
    return ForwardBackwardBody(
        message.model_id, message.seq_id, message.loss_fn, config, message.forward_only, datums
    )


def _proto_datum(index: int, datum: Any) -> dict[str, np.ndarray]:
    tokens = []
    for chunk in datum.model_input:
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise WireError(400, f"datum {index}: only encoded_text chunks are served here")
        tokens.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32))
    arrays = {
        "input_ids": np.concatenate(tokens).astype(np.int64) if tokens else np.zeros(0, np.int64)
    }
    for name, tensor in datum.loss_fn_inputs.items():
        arrays[name] = _proto_tensor(index, name, tensor)
    return arrays


def _proto_tensor(index: int, name: str, tensor: Any) -> np.ndarray:
    dtype = _PROTO_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise WireError(400, f"datum {index}: {name} has an unsupported dtype ({tensor.dtype})")
    if tensor.HasField("sparse_csr"):
        raise WireError(400, f"datum {index}: {name} is sparse (2-D); only 1-D inputs are served")
    try:
        array = np.frombuffer(tensor.dense, dtype=dtype).copy()
    except ValueError as err:
        raise WireError(400, f"datum {index}: {name}: {err}") from None
    shape = list(tensor.shape)
    if shape and int(np.prod(shape)) != array.size:
        raise WireError(400, f"datum {index}: {name} has {array.size} values for shape {shape}")
    return array


def _from_json(document: dict[str, Any]) -> ForwardBackwardBody:
    body = document["forward_backward_input"]
    datums = []
    for datum in body["data"]:
        tokens = [t for chunk in datum["model_input"]["chunks"] for t in chunk["tokens"]]
        arrays = {"input_ids": np.asarray(tokens, dtype=np.int64)}
        for name, tensor in datum.get("loss_fn_inputs", {}).items():
            dtype = _JSON_DTYPES[tensor.get("dtype", "float32")]
            arrays[name] = np.asarray(tensor["data"], dtype=dtype).reshape(-1)
        datums.append(arrays)
    return ForwardBackwardBody(
        model_id=str(document["model_id"]),
        seq_id=int(document.get("seq_id") or 0),
        loss_fn=str(body["loss_fn"]),
        loss_fn_config=body.get("loss_fn_config"),
        forward_only=bool(document.get("forward_only", False)),
        datums=datums,
    )


def forward_backward_output(
    metrics: dict[str, float], outputs: list[dict[str, np.ndarray]]
) -> bytes:
    """The SDK's proto `ForwardBackwardOutput`: one batched ArrayRecord of float32 fields."""
    message = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    message.metrics.update({k: float(v) for k, v in metrics.items()})
    record = message.loss_fn_outputs.add(num_datums=len(outputs))
    for name in sorted({n for datum in outputs for n in datum}):
        arrays = [np.asarray(d[name], dtype=np.float32).reshape(-1) for d in outputs]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
        field_ = record.fields[name]
        field_.data = b"".join(a.tobytes() for a in arrays)
        field_.offsets = offsets.tobytes()
        field_.dtype = pb.DTYPE_FLOAT32
    return message.SerializeToString()


def sample_response(
    sequences: list[tuple[list[int], list[float], str]], prompt_logprobs: np.ndarray | None
) -> bytes:
    """The SDK's proto `SampleResponse` (it takes no JSON for it): per sequence its tokens
    (int32), their logprobs (float32) and "stop" or "length"; the prompt's logprobs
    (float32, NaN where none was computed) when asked."""
    message = pb.SampleResponse()
    for tokens, logprobs, stop_reason in sequences:
        message.sequences.add(
            stop_reason=pb.STOP_REASON_LENGTH if stop_reason == "length" else pb.STOP_REASON_STOP,
            tokens=np.asarray(tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(logprobs, dtype=np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        message.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return message.SerializeToString()
