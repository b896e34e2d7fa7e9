"""A LangGraph tool agent whose calls tito records as one RL trajectory.

The graph is plain LangGraph (a model node, a `ToolNode`, and
`tools_condition` between them) on langchain-openai's `ChatOpenAI`. The only
tito-specific parts are around it:

- `base_url=GATEWAY/g/{group}/t/{trajectory}/v1` puts every LLM call of the
  run into one trajectory of one GRPO group, with no change to the agent;
- `POST /v1/trajectories/{id}/metadata` registers the task (data_source,
  index, extra_info) before the run, the other way to set it besides the
  request body;
- after the run, the reward with named parts and `finish`.

    python examples/python/langgraph_tool_agent.py --gateway http://localhost:8000 \
        --model Qwen/Qwen3-0.6B --group capitals-3 --samples 4
"""

import argparse
import os

import httpx
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

QUESTION = "What is the capital of France, and how many letters does its name have?"
ANSWER = "Paris"

CAPITALS = {"france": "Paris", "italy": "Rome", "japan": "Tokyo"}


@tool
def capital(country: str) -> str:
    """The capital city of a country."""
    return CAPITALS.get(country.strip().lower(), "unknown")


@tool
def letter_count(word: str) -> int:
    """How many letters a word has."""
    return sum(c.isalpha() for c in word)


TOOLS = [capital, letter_count]


def build_graph(llm):
    """model -> (tools -> model)* -> end."""
    model = llm.bind_tools(TOOLS)

    def call_model(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(TOOLS))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


def score(text, answer):
    """Reward parts: the answer named, and the letter count right."""
    acc = 1.0 if answer.lower() in (text or "").lower() else 0.0
    count = 1.0 if str(len(answer)) in (text or "") else 0.0
    return 0.8 * acc + 0.2 * count, {"acc": acc, "count": count}


def trainer_client(gateway, trainer_token=None):
    """HTTP client for the trainer routes (metadata, reward, finish, groups):
    with `[auth] trainer_tokens` set they need one of those tokens."""
    headers = {"Authorization": f"Bearer {trainer_token}"} if trainer_token else {}
    return httpx.Client(base_url=gateway, headers=headers, timeout=30)


def rollout(gateway, group, trajectory_id, model, question=QUESTION, answer=ANSWER, index=0,
            temperature=1.0, api_key="unused", trainer_token=None):
    with trainer_client(gateway, trainer_token) as http:
        http.post(
            f"/v1/trajectories/{trajectory_id}/metadata",
            json={"data_source": "capitals", "index": index,
                  "extra_info": {"question": question, "answer": answer}},
        ).raise_for_status()
        llm = ChatOpenAI(
            base_url=f"{gateway}/g/{group}/t/{trajectory_id}/v1",
            api_key=api_key,
            model=model,
            temperature=temperature,
        )
        result = build_graph(llm).invoke({"messages": [("user", question)]})
        messages = result["messages"]
        final = messages[-1].content
        reward, parts = score(final, answer)
        http.post(
            f"/v1/trajectories/{trajectory_id}/reward", json={"reward": reward, "extra": parts}
        ).raise_for_status()
        http.post(f"/v1/trajectories/{trajectory_id}/finish").raise_for_status()
    return {
        "trajectory_id": trajectory_id,
        "group": group,
        "final": final,
        "reward": reward,
        "reward_parts": parts,
        "tool_results": [m.content for m in messages if m.type == "tool"],
        "llm_calls": sum(1 for m in messages if m.type == "ai"),
    }


def main(gateway, model, group="capitals-0", samples=1, index=0, temperature=1.0,
         api_key="unused", trainer_token=None):
    gateway = gateway.rstrip("/")
    results = [
        rollout(gateway, group, f"{group}-s{i}", model, index=index, temperature=temperature,
                api_key=api_key, trainer_token=trainer_token)
        for i in range(samples)
    ]
    with trainer_client(gateway, trainer_token) as http:
        summary = http.get(f"/v1/groups/{group}").raise_for_status().json()
    return results, summary


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", default="http://localhost:8000", help="tito's address")
    ap.add_argument("--model", required=True, help="the served model name")
    ap.add_argument("--group", default="capitals-0", help="GRPO group of this task's rollouts")
    ap.add_argument("--samples", type=int, default=1, help="rollouts of the task")
    ap.add_argument("--index", type=int, default=0, help="task index (exported as `index`)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--api-key", default=os.environ.get("TITO_API_KEY", "unused"),
                    help="for the chat routes (default $TITO_API_KEY)")
    ap.add_argument("--trainer-token", default=os.environ.get("TITO_TRAINER_TOKEN"),
                    help="for metadata, reward, finish and groups (default $TITO_TRAINER_TOKEN)")
    args = ap.parse_args()
    results, group = main(args.gateway, args.model, args.group, args.samples, args.index,
                          args.temperature, args.api_key, args.trainer_token)
    for r in results:
        print(f"{r['trajectory_id']}: {r['llm_calls']} LLM calls, tools -> {r['tool_results']}, "
              f"reward {r['reward']} {r['reward_parts']}: {r['final']!r}")
    print(f"group {group['id']}: size {group['size']}, complete {group['complete']}, "
          f"mean reward {group['mean_reward']}")
