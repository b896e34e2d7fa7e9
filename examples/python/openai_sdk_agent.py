"""A multi-turn tool agent on the official OpenAI SDK, recorded by tito.

The agent is ordinary OpenAI SDK code. Two things make it an RL rollout:

- `base_url` is `GATEWAY/g/{group}/t/{trajectory}/v1`: every call lands in
  trajectory `{trajectory}` of GRPO group `{group}` (the n rollouts of one
  task share a group, exported as verl's `uid`);
- `extra_body={"return_token_ids": True}` (vLLM's extension, served by tito)
  returns the exact prompt ids and sampled ids of each turn, which the agent
  may log or check; tito records them either way.

After the episode it scores the answer and posts the reward (with named
parts, exported as `reward_extra_info`) and finishes the trajectory, which
makes it visible to trainers reading `GET /v1/export?consumer=...`.

    python examples/python/openai_sdk_agent.py --gateway http://localhost:8000 \
        --model Qwen/Qwen3-0.6B --group task-17 --samples 4
"""

import argparse
import json
import os
import re

import httpx
from openai import OpenAI

QUESTION = "What is (17 + 25) * 3? Use the tools, then state the number."
ANSWER = 126

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.capitalize()} two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
    for name in ("add", "multiply")
]


def run_tool(name, arguments):
    """Runs one tool call; a malformed call gets an error string back, as a
    real environment would answer it."""
    try:
        args = json.loads(arguments)
        a, b = float(args["a"]), float(args["b"])
    except (ValueError, KeyError, TypeError) as e:
        return f"error: bad arguments ({e})"
    if name == "add":
        value = a + b
    elif name == "multiply":
        value = a * b
    else:
        return f"error: unknown tool {name!r}"
    return str(int(value)) if value == int(value) else str(value)


def score(text, answer):
    """1.0 when the last number in the final answer is `answer`."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text or "")
    return 1.0 if numbers and float(numbers[-1]) == float(answer) else 0.0


def trainer_client(gateway, trainer_token=None):
    """HTTP client for the trainer routes (reward, finish, groups): with
    `[auth] trainer_tokens` set they need one of those tokens."""
    headers = {"Authorization": f"Bearer {trainer_token}"} if trainer_token else {}
    return httpx.Client(base_url=gateway, headers=headers, timeout=30)


def rollout(gateway, group, trajectory_id, model, question=QUESTION, answer=ANSWER,
            index=0, max_turns=6, temperature=1.0, api_key="unused", trainer_token=None):
    """One episode. Returns what happened, turn by turn, with the ids each
    turn's response carried. `api_key`: one of `[auth] api_keys` if set."""
    client = OpenAI(base_url=f"{gateway}/g/{group}/t/{trajectory_id}/v1", api_key=api_key)
    messages = [{"role": "user", "content": question}]
    turns = []
    final = ""
    for turn in range(max_turns):
        extra = {"return_token_ids": True}
        if turn == 0:
            # Task metadata for the trainer (verl's data_source / index / extra_info).
            extra["trajectory_metadata"] = {
                "data_source": "arithmetic",
                "index": index,
                "extra_info": {"question": question, "answer": answer},
            }
        resp = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, temperature=temperature, extra_body=extra
        )
        choice = resp.choices[0]
        turns.append({
            "prompt_token_ids": (resp.model_extra or {}).get("prompt_token_ids"),
            "token_ids": (choice.model_extra or {}).get("token_ids"),
            "finish_reason": choice.finish_reason,
        })
        msg = choice.message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            final = msg.content or ""
            break
        for call in msg.tool_calls:
            messages.append({
                "role": "tool",
                "tool_call_id": call.id,
                "content": run_tool(call.function.name, call.function.arguments),
            })

    reward = score(final, answer)
    tool_calls = sum(1 for m in messages if m["role"] == "tool")
    with trainer_client(gateway, trainer_token) as http:
        http.post(
            f"/v1/trajectories/{trajectory_id}/reward",
            json={"reward": reward, "extra": {"acc": reward, "tool_calls": tool_calls}},
        ).raise_for_status()
        http.post(f"/v1/trajectories/{trajectory_id}/finish").raise_for_status()
    return {
        "trajectory_id": trajectory_id,
        "group": group,
        "turns": turns,
        "final": final,
        "reward": reward,
        "tool_calls": tool_calls,
    }


def main(gateway, model, group="task-0", samples=1, question=QUESTION, answer=ANSWER, index=0,
         temperature=1.0, api_key="unused", trainer_token=None):
    """`samples` rollouts of one task in one group (GRPO's n), then the
    group as the gateway reports it."""
    gateway = gateway.rstrip("/")
    results = [
        rollout(gateway, group, f"{group}-s{i}", model, question, answer, index=index,
                temperature=temperature, api_key=api_key, trainer_token=trainer_token)
        for i in range(samples)
    ]
    with trainer_client(gateway, trainer_token) as http:
        summary = http.get(f"/v1/groups/{group}").raise_for_status().json()
    return results, summary


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", default="http://localhost:8000", help="tito's address")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--group", default="task-0", help="GRPO group of this task's rollouts")
    ap.add_argument("--samples", type=int, default=1, help="rollouts of the task")
    ap.add_argument("--index", type=int, default=0, help="task index (exported as `index`)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--api-key", default=os.environ.get("TITO_API_KEY", "unused"),
                    help="for the chat routes (default $TITO_API_KEY)")
    ap.add_argument("--trainer-token", default=os.environ.get("TITO_TRAINER_TOKEN"),
                    help="for reward, finish and groups (default $TITO_TRAINER_TOKEN)")
    args = ap.parse_args()
    results, group = main(args.gateway, args.model, args.group, args.samples, index=args.index,
                          temperature=args.temperature, api_key=args.api_key,
                          trainer_token=args.trainer_token)
    for r in results:
        sampled = sum(len(t["token_ids"] or []) for t in r["turns"])
        print(f"{r['trajectory_id']}: {len(r['turns'])} turns, {sampled} sampled tokens, "
              f"{r['tool_calls']} tool calls, reward {r['reward']}: {r['final']!r}")
    print(f"group {group['id']}: size {group['size']}, complete {group['complete']}, "
          f"mean reward {group['mean_reward']}")
