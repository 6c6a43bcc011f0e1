from bench.arrivals import poisson_offsets, with_poisson_arrivals
from bench.runner import RunOptions, build_body
from bench.synthetic import PROGRAM_HEADER, SESSION_HEADER, agent_programs, chat_sessions
from bench.textgen import CHARS_PER_TOKEN


def test_chat_sessions_are_deterministic_and_share_the_system_prompt() -> None:
    a = chat_sessions(sessions=5, turns=(2, 4), system_tokens=64, seed=7)
    b = chat_sessions(sessions=5, turns=(2, 4), system_tokens=64, seed=7)
    assert a == b
    assert len({s.system for s in a.sessions}) == 1
    assert len(a.sessions[0].system) == 64 * CHARS_PER_TOKEN
    assert all(2 <= len(s.turns) <= 4 for s in a.sessions)
    assert all(len(t.reply) == t.max_tokens * CHARS_PER_TOKEN for s in a.sessions for t in s.turns)
    assert chat_sessions(sessions=5, seed=8) != a
    # Each conversation names itself, differently from every other one.
    assert len({s.headers[SESSION_HEADER] for s in a.sessions}) == 5


def test_agent_programs_fan_out_over_a_program_context() -> None:
    w = agent_programs(programs=3, calls=(5, 5), context_tokens=128, fanout=3, seed=1)
    assert w.n_requests == 3 * 5 * 3
    headers = {s.headers[PROGRAM_HEADER] for s in w.sessions}
    assert len(headers) == 3
    assert len({s.system for s in w.sessions}) == 3  # each program its own long context
    turn = w.sessions[0].turns[0]
    assert len(turn.parallel) == 2 and turn.user not in turn.parallel


def test_chat_body_grows_turn_by_turn() -> None:
    w = chat_sessions(sessions=1, turns=(3, 3), system_tokens=16)
    s = w.sessions[0]
    opts = RunOptions(base_url="http://x", model="m")
    history: list[tuple[str, str]] = []
    bodies = []
    for t in s.turns:
        bodies.append(build_body(opts, s, history, t.user, t.max_tokens))
        history.append((t.user, t.reply))
    lengths = [len(b["messages"]) for b in bodies]
    assert lengths == [2, 4, 6]  # system + (user, assistant) per earlier turn + user
    # Each prompt extends the previous one: the prefix a cache can reuse.
    assert bodies[2]["messages"][:3] == bodies[1]["messages"][:3]
    assert bodies[1]["messages"][2] == {"role": "assistant", "content": s.turns[0].reply}
    assert bodies[0]["stream_options"] == {"include_usage": True}
    assert bodies[0]["max_tokens"] == s.turns[0].max_tokens and bodies[0]["ignore_eos"]


def test_completions_body_is_one_prompt_with_the_same_prefix_property() -> None:
    s = chat_sessions(sessions=1, turns=(2, 2)).sessions[0]
    opts = RunOptions(base_url="http://x/v1", model="m", api="completions")
    first = build_body(opts, s, [], s.turns[0].user, 8)["prompt"]
    second = build_body(opts, s, [(s.turns[0].user, s.turns[0].reply)], s.turns[1].user, 8)
    assert second["prompt"].startswith(first.removesuffix("\nAssistant:"))
    assert opts.endpoint() == "http://x/v1/completions"
    assert RunOptions(base_url="http://x/", model="m").endpoint() == "http://x/v1/chat/completions"


def test_poisson_arrivals() -> None:
    offsets = poisson_offsets(2000, rate=4.0, seed=3)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    mean_gap = offsets[-1] / (len(offsets) - 1)
    assert 0.22 < mean_gap < 0.28  # 1/rate = 0.25
    assert offsets == poisson_offsets(2000, rate=4.0, seed=3)
    w = with_poisson_arrivals(chat_sessions(sessions=3), 2.0, seed=1)
    assert [s.arrival_s for s in w.sessions] == poisson_offsets(3, 2.0, 1)
