"""Subprocess body of ``support.run_engine_generate``: one engine, its generate calls, one JSON line out."""

import json
import sys


def main() -> None:
    import sglang

    request = json.loads(sys.argv[1])
    engine = sglang.Engine(skip_tokenizer_init=True, **request["engine_args"])
    try:
        prompts, params = request["input_ids"], request["sampling_params"]
        report = {}
        for mode in request["modes"]:
            if mode == "concurrent":  # one batch: the scheduler runs the requests together
                outputs = engine.generate(input_ids=prompts[: request["concurrent_requests"]], sampling_params=params)
            else:
                outputs = [engine.generate(input_ids=ids, sampling_params=params) for ids in prompts]
            report[mode] = {
                "output_ids": [o["output_ids"] for o in outputs],
                "meta_info": [o["meta_info"] for o in outputs],
            }
        report["scheduler_states"] = engine.get_server_info()["internal_states"]
    finally:
        engine.shutdown()
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
