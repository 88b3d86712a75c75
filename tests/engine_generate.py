"""Body of ``support.run_engine_generate``: one engine, its generate calls, one JSON line out (run in a child of
``engine_zygote.py``, or as a script with the request as its argument)."""

import json
import sys


def generate_or_refusal(engine, input_ids: list[int], sampling_params: dict):
    """One request's output, or ``{"error": message}`` when the engine refuses it (the message SGLang gives)."""
    try:
        return engine.generate(input_ids=input_ids, sampling_params=sampling_params)
    except ValueError as e:
        return {"error": str(e), "output_ids": None, "meta_info": {"finish_reason": None}}


def streamed_or_refusal(engine, input_ids: list[int], sampling_params: dict):
    """One streamed request (``stream=True``, what ``"stream": true`` on /generate yields): its last chunk, with every
    chunk's cumulative ``(text, output_ids, finish_reason)`` under ``"chunks"``."""
    chunks = []
    try:
        for chunk in engine.generate(input_ids=input_ids, sampling_params=sampling_params, stream=True):
            chunks.append({"text": chunk.get("text"), "output_ids": list(chunk["output_ids"]),
                           "finish_reason": chunk["meta_info"]["finish_reason"]})  # fmt: skip
    except ValueError as e:
        return {"error": str(e), "output_ids": None, "meta_info": {"finish_reason": None}}
    return {**chunk, "output_ids": list(chunk["output_ids"]), "chunks": chunks}


def run(request: dict) -> dict:
    """One engine built from ``request["engine_args"]``, the requests sent as its modes say, its report."""
    import sglang

    engine = sglang.Engine(**{"skip_tokenizer_init": True, **request["engine_args"]})
    try:
        prompts, params = request["input_ids"], request["sampling_params"]
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)  # one dict each, or shared
        streamed = request.get("streamed") or [False] * len(prompts)
        report = {}
        for mode in request["modes"]:
            if mode == "concurrent":  # one batch: the scheduler runs the requests together
                count = request["concurrent_requests"]
                outputs = engine.generate(input_ids=prompts[:count], sampling_params=per_prompt[:count])
            else:
                outputs = [(streamed_or_refusal if stream else generate_or_refusal)(engine, ids, p)
                           for ids, p, stream in zip(prompts, per_prompt, streamed)]
            outputs = [o if isinstance(o, list) else [o] for o in outputs]  # n > 1: the n choices of one prompt
            report[mode] = {
                "output_ids": [[c["output_ids"] for c in o] if len(o) > 1 else o[0]["output_ids"] for o in outputs],
                "meta_info": [[c["meta_info"] for c in o] if len(o) > 1 else o[0]["meta_info"] for o in outputs],
                "text": [[c.get("text") for c in o] if len(o) > 1 else o[0].get("text") for o in outputs],
                "error": [o[0].get("error") for o in outputs],
                "chunks": [o[0].get("chunks") for o in outputs],
            }
        report["scheduler_states"] = engine.get_server_info()["internal_states"]
    finally:
        engine.shutdown()
    return report


def main() -> None:
    print(json.dumps(run(json.loads(sys.argv[1])), default=str))


if __name__ == "__main__":
    main()
