"""A DDTREE server started by the launcher, as a user meets it: request errors that name the problem and
nothing of the server, refusals that name DDTREE, ``--api-key`` on every endpoint, loopback by default, and a
first chat request as fast as later ones. One server (tiny models, CPU engine) answers every check."""

import json
import time
import urllib.error
import urllib.request
from typing import Optional

import pytest

from sglang_ddtree.serving import free_port, launched_server
from sglang_ddtree.server_hygiene import (
    describe_validation_errors,
    json_error_position,
    refuse_token_ids_outside_the_vocabulary,
)
from tiny_models import TinyShape, make_dflash_drafter, make_qwen3_target

TRITON_LAUNCH_LOG_ENV = "DDTREE_TEST_TRITON_LAUNCH_LOG"  # tests/cpu_shims/sitecustomize.py

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("server_hygiene")]  # one worker builds the module's servers

API_KEY = "sk-hygiene-test"
CPU_SERVER_FLAGS = [
    "--device", "cpu",
    "--attention-backend", "triton",
    "--mem-fraction-static", "0.3",
    "--max-total-tokens", "4096",
    "--disable-cuda-graph",
    "--sleep-on-idle",  # an idle scheduler otherwise spins a whole core, of CI's two
    "--dtype", "float32",
]  # fmt: skip
CHAT = {"model": "default", "messages": [{"role": "user", "content": "t9 t10"}], "max_tokens": 2, "temperature": 0}


def call(url: str, payload=None, *, raw: Optional[bytes] = None, key: Optional[str] = API_KEY,
         method: Optional[str] = None) -> tuple[int, str]:  # fmt: skip
    """(status, body) of one request; ``payload`` as JSON, or ``raw`` bytes as the body."""
    body = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def error_message(body: str) -> str:
    """The message of SGLang's error envelopes (``ErrorResponse`` or ``{"error": {"message": ...}}``)."""
    parsed = json.loads(body)
    return parsed["message"] if "message" in parsed else parsed["error"]["message"]


def assert_clean(message: str) -> None:
    """Nothing of the server's insides: no file path, no traceback, no Python source location."""
    for leak in ('File "', ".py", "site-packages", "Traceback", "/work/", "line 8", "in generate_request"):
        assert leak not in message, message


def test_json_errors_are_placed_by_line_and_column():
    assert json_error_position('{"a": 1,\n  , }', 11) == "line 2 column 3"
    assert json_error_position(b'{"a": }', 6) == "line 1 column 7"
    assert json_error_position(None, 6) == "position 6"  # the body is not known: the offset, still no internals
    errors = [{"type": "json_invalid", "loc": ("body", 6), "msg": "JSON decode error", "input": {},
               "ctx": {"error": "unexpected character"}}]  # fmt: skip
    assert describe_validation_errors(errors, '{"a": }') == "malformed JSON at line 1 column 7: unexpected character"
    assert describe_validation_errors([{"type": "missing", "loc": ("body",), "msg": "Field required"}], b"") == (
        "request body: Field required")


def test_a_token_id_outside_the_vocabulary_is_named_with_its_position():
    manager = type("Manager", (), {"model_config": type("Config", (), {"vocab_size": 64})()})()
    request = type("Request", (), {"image_data": None})()
    assert refuse_token_ids_outside_the_vocabulary(manager, request, [0, 5, 63]) is None
    with pytest.raises(ValueError, match=r"input_ids\[2\] = 64 is not a token of this model: its vocabulary is \[0, 64\)"):
        refuse_token_ids_outside_the_vocabulary(manager, request, [0, 5, 64, 1000])
    with pytest.raises(ValueError, match=r"input_ids\[0\] = -1 "):
        refuse_token_ids_outside_the_vocabulary(manager, request, [-1])
    with_image = type("Request", (), {"image_data": ["an image"]})()
    assert refuse_token_ids_outside_the_vocabulary(manager, with_image, [1000]) is None  # SGLang's processors' ids


@pytest.fixture(scope="module")
def triton_launch_log(tmp_path_factory) -> str:
    """Where the server's processes log each Triton launch a GPU would compile first (tests/cpu_shims)."""
    return str(tmp_path_factory.mktemp("hygiene_launches") / "launches.jsonl")


@pytest.fixture(scope="module")
def server(tmp_path_factory, triton_launch_log):
    root = tmp_path_factory.mktemp("hygiene_models")
    target = make_qwen3_target(str(root / "qwen3"), TinyShape(num_layers=4, vocab_size=64))
    drafter = make_dflash_drafter(str(root / "dflash"), target_num_layers=4, block_size=4,
                                  shape=TinyShape(num_layers=1, vocab_size=64), target_layer_ids=[0, 2])  # fmt: skip
    args = ["--algo", "ddtree", "--model-path", target, "--draft-model-path", drafter, "--budget", "8",
            *CPU_SERVER_FLAGS, "--api-key", API_KEY]  # fmt: skip
    with launched_server(args, free_port(), env={TRITON_LAUNCH_LOG_ENV: triton_launch_log}) as url:
        yield url


def new_kernel_specialisations(log_path: str, since_line: int) -> set[str]:
    with open(log_path) as log:
        return {json.loads(line)["kernel"] for line in log.readlines()[since_line:]}


def test_first_chat_request_is_not_slower_than_later_ones(server, triton_launch_log):
    """On the H200 the first /v1/chat/completions of a demo server took 7.7 s and later ones milliseconds. SGLang's
    start-up warm-up only sends a greedy /generate, so whatever the chat path or a sampled request does once
    (template, parsers, serving state, a kernel compiled on first use) would land on the first user. So a newcomer's
    requests — the chat without sampling parameters (SGLang samples it at temperature 1), a readiness probe that
    generates (``/health_generate``), a greedy chat — are no slower the first time and launch no Triton kernel in a
    specialisation that start-up did not (each would be a compile on a GPU). Runs first in this module, on a server
    nothing else has talked to."""
    with open(triton_launch_log) as log:
        compiled_at_start_up = len(log.readlines())
    newcomer_chat = {key: value for key, value in CHAT.items() if key != "temperature"}
    seconds = []
    for _ in range(3):
        start = time.monotonic()
        status, body = call(server + "/v1/chat/completions", newcomer_chat)
        seconds.append(time.monotonic() - start)
        assert status == 200, body
    first, later = seconds[0], min(seconds[1:])
    assert first <= 3 * later + 5.0, f"first chat {first:.2f} s, later ones {seconds[1:]}"
    assert call(server + "/health_generate", method="GET")[0] == 200
    assert call(server + "/v1/chat/completions", CHAT)[0] == 200
    # SGLang's CPU engine verifies sampled requests with its greedy tree kernel (eagle_sample on CPU); on CUDA they
    # take sgl_kernel's precompiled rejection sampling, which nothing compiles.
    cpu_only = {"sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_kernel_triton"}
    assert new_kernel_specialisations(triton_launch_log, compiled_at_start_up) - cpu_only == set()


@pytest.mark.parametrize("path", ["/generate", "/v1/chat/completions", "/v1/completions"])
def test_malformed_json_is_named_with_its_line_and_column_without_server_paths(server, path):
    """SGLang 0.5.17's 400 for malformed JSON ended with the endpoint's source file and line in the server."""
    status, body = call(server + path, raw=b'{"text": "t5",\n  , "x": 1}')
    assert status == 400
    message = error_message(body)
    assert message.startswith("malformed JSON at line 2 column 3: "), message
    assert_clean(message)


@pytest.mark.parametrize(
    "path, payload, expected",
    [
        ("/v1/chat/completions", {"model": "default", "messages": "t9"}, "messages: Input should be a valid list"),
        ("/v1/chat/completions", {"model": "default"}, "messages: Field required"),
        ("/generate", {"input_ids": "t9"}, "input_ids: Value error, must be list or null"),
    ],
)  # fmt: skip
def test_a_missing_or_mistyped_field_is_named_without_server_paths(server, path, payload, expected):
    status, body = call(server + path, payload)
    assert status == 400
    message = error_message(body)
    assert message.startswith(expected), message
    assert_clean(message)


@pytest.mark.parametrize(
    "path, payload, refused",
    [
        ("/v1/completions", {"model": "default", "prompt": "t9", "max_tokens": 2, "logprobs": 2}, "return_logprob"),
        ("/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True,
                       "top_logprobs_num": 2}, "return_logprob"),
        ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 2}, "return_logprob"),
        ("/v1/chat/completions", {**CHAT, "frequency_penalty": 0.5}, "frequency_penalty"),
        ("/v1/completions", {"model": "default", "prompt": "t9", "max_tokens": 2, "presence_penalty": 0.5},
         "presence_penalty"),
    ],
)  # fmt: skip
def test_every_refusal_names_ddtree(server, path, payload, refused):
    """DFlash's admission check and the tree's own limits, reached through each API, speak of DDTREE (the
    algorithm the user started), never of DFLASH, and say what is refused."""
    status, body = call(server + path, payload)
    assert status == 400
    message = error_message(body)
    assert f"DDTREE speculative decoding does not support {refused}" in message, message
    assert "DFLASH" not in message
    assert_clean(message)


@pytest.mark.parametrize("path, payload", [
    ("/generate", {"input_ids": [5, 6, 1000], "sampling_params": {"max_new_tokens": 2}}),
    ("/v1/completions", {"model": "default", "prompt": [5, 64], "max_tokens": 2}),
])  # fmt: skip
def test_a_token_id_outside_the_vocabulary_gets_a_400_and_the_server_lives_on(server, path, payload):
    """SGLang 0.5.17 lets such an id reach the embedding: the scheduler died (``IndexError`` on the CPU engine) and
    with it the server, for every client."""
    status, body = call(server + path, payload)
    assert status == 400, body
    message = error_message(body)
    assert "is not a token of this model: its vocabulary is [0, 64)" in message, message
    assert_clean(message)
    assert call(server + "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1}})[0] == 200


def test_the_server_still_serves_after_every_bad_request(server):
    """After the refusals above, a plain request still gets every token it asked for. Greedy with the EOS ignored:
    SGLang samples at temperature 1 by default, and the tiny random target draws its EOS about once in 64 tokens."""
    greedy = {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}
    status, body = call(server + "/generate", {"input_ids": [5, 6, 7], "sampling_params": greedy})
    assert status == 200 and len(json.loads(body)["output_ids"]) == 2


@pytest.mark.parametrize(
    "method, path, payload",
    [
        ("POST", "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1}}),
        ("POST", "/v1/chat/completions", {**CHAT, "max_tokens": 1}),
        ("POST", "/v1/completions", {"model": "default", "prompt": "t9", "max_tokens": 1}),
        ("GET", "/v1/models", None),
        ("GET", "/server_info", None),
        ("GET", "/model_info", None),
        ("GET", "/get_load", None),
        ("POST", "/flush_cache", None),
    ],
)  # fmt: skip
def test_api_key_protects_every_serving_and_admin_endpoint(server, method, path, payload):
    """``--api-key`` through the launcher: 401 without the key or with a wrong one, 200 with it."""
    assert call(server + path, payload, key=None, method=method)[0] == 401
    assert call(server + path, payload, key="sk-wrong", method=method)[0] == 401
    status, body = call(server + path, payload, method=method)
    assert status == 200, body


def test_health_stays_open_for_liveness_probes(server):
    """SGLang 0.5.17 lets /health* (and /metrics, when enabled) through without the key, for liveness probes and
    scrapers (``utils/auth.decide_request_auth``): recorded here so that a change shows up."""
    assert call(server + "/health", key=None)[0] == 200
    assert call(server + "/health_generate", key=None)[0] == 200  # open too, though it runs a 1-token generation


def test_the_server_binds_loopback_by_default(server):
    status, body = call(server + "/server_info")
    assert status == 200 and json.loads(body)["host"] == "127.0.0.1"
