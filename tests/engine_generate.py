"""Subprocess body of ``support.run_engine_generate``: one engine, one generate call, one JSON line out."""

import json
import sys


def main() -> None:
    import sglang

    request = json.loads(sys.argv[1])
    engine = sglang.Engine(skip_tokenizer_init=True, **request["engine_args"])
    try:
        prompts, params = request["input_ids"], request["sampling_params"]
        if request["concurrent"]:
            outputs = engine.generate(input_ids=prompts, sampling_params=params)
        else:
            outputs = [engine.generate(input_ids=ids, sampling_params=params) for ids in prompts]
        server_info = engine.get_server_info()
    finally:
        engine.shutdown()
    report = {
        "output_ids": [o["output_ids"] for o in outputs],
        "meta_info": [o["meta_info"] for o in outputs],
        "scheduler_states": server_info["internal_states"],
    }
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
