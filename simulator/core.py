"""The engine model: a continuous-batching scheduler over a paged KV cache, with no I/O.

It follows vLLM V1's scheduler closely enough for a router to see the same behaviour:
- every step first serves the running requests in order (a decode takes one token, an
  unfinished prefill a chunk), then admits waiting requests first-come-first-served while the
  token budget (`max_num_batched_tokens`) and `max_num_seqs` allow (chunked prefill);
- a request's new blocks come from the block pool; when it has too few free blocks, the most
  recently admitted running request is preempted (its blocks freed, recomputed later);
- a waiting request first reuses the longest cached prefix of full blocks;
- a request whose computed tokens reach its length samples one token from the language model.
Time is passed in by the caller: `schedule(now)` plans a step and says how long it takes;
`finish_step(step, now)` applies it. Unit tests drive it without sleeping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from simulator.kv_cache import ROOT_HASH, BlockHash, BlockPool, chain_hashes
from simulator.lm import DeterministicLM
from simulator.profiles import Profile
from simulator.request import SimRequest, Status, TokenEvent
from simulator.tokenizer import EOS_ID, Tokenizer


class CoreListener:
    """Hooks for metrics; the base class ignores everything."""

    def on_step(self, step: Step) -> None: ...
    def on_preempt(self, req: SimRequest) -> None: ...
    def on_prefix_query(self, queried: int, hit: int) -> None: ...
    def on_token(self, req: SimRequest, now: float, first: bool) -> None: ...
    def on_finished(self, req: SimRequest) -> None: ...
    def on_held_expired(self, req: SimRequest) -> None: ...
    def on_lora_state(self, running: list[str], waiting: list[str]) -> None: ...


@dataclass(slots=True)
class Step:
    chunks: list[tuple[SimRequest, int]]
    duration: float
    new_tokens: int
    context_tokens: int
    num_prefill_reqs: int
    num_decode_reqs: int
    started_at: float


@dataclass(slots=True)
class CoreCounters:
    steps: int = 0
    preemptions: int = 0
    prefix_queries: int = 0  # tokens
    prefix_hits: int = 0  # tokens
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)


class EngineCore:
    def __init__(
        self,
        profile: Profile,
        tokenizer: Tokenizer,
        lm: DeterministicLM,
        listener: CoreListener | None = None,
        max_loras: int | None = None,
        *,
        record_kv_events: bool = False,
    ) -> None:
        self.profile = profile
        self.tokenizer = tokenizer
        self.lm = lm
        self.listener = listener or CoreListener()
        self.pool = BlockPool(
            profile.num_gpu_blocks, profile.enable_prefix_caching, record_events=record_kv_events
        )
        self.block_size = profile.block_size
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.requests: dict[str, SimRequest] = {}
        # Prefill side of P/D: finished requests whose blocks wait to be read, with deadlines.
        self.held: dict[str, tuple[SimRequest, float]] = {}
        self.counters = CoreCounters()
        self.slowdown = 1.0  # a fault multiplies step durations
        # Seconds a prefill engine keeps blocks for a decode engine that never reads them
        # (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT defaults to 480 s).
        self.hold_timeout_s = 480.0
        self._token_str = tokenizer.token_str
        # LoRA on: at most this many distinct adapters in a batch (None: LoRA off).
        self.max_loras = max_loras

    # ---- requests in and out -------------------------------------------------------------
    def add_request(self, req: SimRequest) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id}")
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running) or any(r.status is Status.WAITING for r in self.waiting)

    def next_ready_at(self, now: float) -> float | None:
        """When the first waiting request that is not ready yet becomes ready."""
        pending = [
            r.ready_at for r in self.waiting if r.status is Status.WAITING and r.ready_at > now
        ]
        return min(pending) if pending else None

    def num_waiting(self) -> int:
        return len(self.waiting)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks. False if it is unknown or already done."""
        req = self.requests.get(request_id)
        if req is None or req.finished:
            return False
        if req.status is Status.RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self._finish(req, "abort", None, now=None)
        return True

    # ---- P/D ------------------------------------------------------------------------------
    def begin_remote_prefill(self, req: SimRequest) -> int | None:
        """Reserve blocks for a decode-side request whose prompt KV comes from a prefill engine.

        The last prompt token is recomputed locally to sample the first output, as vLLM's
        NixlConnector does. Returns the number of tokens to pull (after local prefix hits),
        or None when the blocks cannot be reserved (then the request prefills locally).
        """
        self.add_request(req)
        to_load = len(req.prompt_ids) - 1
        hit_blocks = self._lookup_prefix(req, limit_tokens=to_load)
        hit_tokens = len(hit_blocks) * self.block_size
        need = -(-to_load // self.block_size) - len(hit_blocks)
        fresh = self.pool.reuse_and_allocate(hit_blocks, max(need, 0))
        if fresh is None:
            return None
        req.blocks = hit_blocks + fresh
        req.num_cached_blocks = len(hit_blocks)
        req.status = Status.WAITING_FOR_REMOTE_KVS
        return to_load - hit_tokens

    def finish_remote_prefill(self, req: SimRequest, ok: bool) -> None:
        """The pull ended: on success the prompt (but its last token) counts as computed."""
        if req.status is not Status.WAITING_FOR_REMOTE_KVS:
            return  # aborted meanwhile
        req.status = Status.WAITING
        if ok:
            req.num_computed = len(req.prompt_ids) - 1
            req.prefix_hit_tokens = req.num_cached_blocks * self.block_size
            # vLLM counts the whole remote prompt as transferred (local_compute 0), though the
            # last token is run again here to sample the first output.
            req.external_tokens = len(req.prompt_ids) - req.prefix_hit_tokens
            self._register_full_blocks(req)
        else:
            self.pool.free(req.blocks)
            req.blocks = []
            req.num_cached_blocks = 0
            req.prefix_hit_tokens = req.external_tokens = 0

    def release_held(self, request_id: str) -> SimRequest | None:
        """A decode engine read the blocks (or gave up): free them."""
        entry = self.held.pop(request_id, None)
        if entry is None:
            return None
        req = entry[0]
        self.pool.free(req.blocks)
        req.blocks = []
        return req

    def expire_held(self, now: float) -> int:
        expired = [rid for rid, (_r, deadline) in self.held.items() if deadline <= now]
        for rid in expired:
            req = self.release_held(rid)
            if req is not None:
                self.listener.on_held_expired(req)
        return len(expired)

    # ---- the step -------------------------------------------------------------------------
    def schedule(self, now: float) -> Step | None:
        budget = self.profile.max_num_batched_tokens
        chunks: list[tuple[SimRequest, int]] = []
        preempted = False
        new_tokens = context_tokens = n_prefill = n_decode = 0
        pairs = 0.0  # attention (query, key) pairs this step computes

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            computed = req.num_computed
            n = min(req.num_tokens - computed, budget)
            while not self._grow(req, computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                chunks.append((req, n))
                budget -= n
                new_tokens += n
                context_tokens += computed
                pairs += n * (computed + n / 2)
                if n == 1 and req.output_ids:
                    n_decode += 1
                else:
                    n_prefill += 1
                i += 1
                continue
            break  # the request itself was preempted: nothing more fits

        if not preempted:
            skipped: list[SimRequest] = []
            lora_cap = self.max_loras or 0
            loras = {r.lora for r in self.running if r.lora is not None} if lora_cap else None
            while self.waiting and budget > 0 and len(self.running) < self.profile.max_num_seqs:
                req = self.waiting[0]
                if req.status is Status.WAITING_FOR_REMOTE_KVS:
                    skipped.append(self.waiting.popleft())
                    continue
                if req.ready_at > now:
                    break  # still in the API server; later arrivals are not ready either
                lora = req.lora
                if (
                    loras is not None
                    and lora is not None
                    and lora not in loras
                    and len(loras) >= lora_cap
                ):
                    skipped.append(self.waiting.popleft())  # as vLLM: no free LoRA slot
                    continue
                admitted = self._admit(req, budget)
                if admitted is None:
                    break
                n = admitted
                if loras is not None and lora is not None:
                    loras.add(lora)
                self.waiting.popleft()
                req.status = Status.RUNNING
                if req.first_scheduled is None:
                    req.first_scheduled = now
                self.running.append(req)
                chunks.append((req, n))
                budget -= n
                new_tokens += n
                context_tokens += req.num_computed
                pairs += n * (req.num_computed + n / 2)
                n_prefill += 1
            self.waiting.extendleft(reversed(skipped))

        if not chunks:
            return None
        duration = (
            self.profile.step_time.duration(new_tokens, context_tokens, pairs) * self.slowdown
        )
        step = Step(chunks, duration, new_tokens, context_tokens, n_prefill, n_decode, now)
        self.counters.steps += 1
        if self.max_loras:
            self.listener.on_lora_state(
                list(dict.fromkeys(r.lora for r in self.running if r.lora is not None)),
                list(dict.fromkeys(r.lora for r in self.waiting if r.lora is not None)),
            )
        self.listener.on_step(step)
        return step

    def finish_step(self, step: Step, now: float) -> None:
        for req, n in step.chunks:
            if req.status is not Status.RUNNING:
                continue  # aborted while the step ran
            computed = req.num_computed = req.num_computed + n
            if computed // self.block_size > req.num_cached_blocks:
                self._register_full_blocks(req)
            if computed == req.num_tokens:
                self._sample(req, now)

    # ---- internals ------------------------------------------------------------------------
    def _lookup_prefix(self, req: SimRequest, limit_tokens: int) -> list[int]:
        tokens = req.all_token_ids()
        req.block_hashes = chain_hashes(tokens, self.block_size, req.block_hashes, _root(req))
        max_blocks = limit_tokens // self.block_size
        hits = self.pool.lookup_prefix(req.block_hashes[:max_blocks])
        queried = len(tokens)
        self.counters.prefix_queries += queried
        self.counters.prefix_hits += len(hits) * self.block_size
        self.listener.on_prefix_query(queried, len(hits) * self.block_size)
        return hits

    def _admit(self, req: SimRequest, budget: int) -> int | None:
        """Blocks and a first chunk for a waiting request; None if the cache cannot hold it."""
        hits: list[int] = []
        if req.num_computed == 0:
            # At least one token must be computed to sample, so a full hit leaves one block.
            hits = self._lookup_prefix(req, limit_tokens=req.num_tokens - 1)
        computed = req.num_computed + len(hits) * self.block_size
        n = min(req.num_tokens - computed, budget)
        need = -(-(computed + n) // self.block_size) - len(req.blocks) - len(hits)
        fresh = self.pool.reuse_and_allocate(hits, max(need, 0))
        if fresh is None:
            return None
        if hits:
            req.blocks = hits + req.blocks
            req.num_cached_blocks = len(hits)
            req.num_computed = computed
            req.prefix_hit_tokens = computed
        req.blocks.extend(fresh)
        return n

    def _grow(self, req: SimRequest, num_tokens: int) -> bool:
        need = -(-num_tokens // self.block_size) - len(req.blocks)
        if need <= 0:
            return True
        fresh = self.pool.allocate(need)
        if fresh is None:
            return False
        req.blocks.extend(fresh)
        return True

    def _preempt(self, req: SimRequest) -> None:
        self.pool.free(req.blocks)
        req.blocks = []
        req.num_computed = 0
        req.num_cached_blocks = 0
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(req)
        self.listener.on_preempt(req)

    def _register_full_blocks(self, req: SimRequest) -> None:
        full = req.num_computed // self.block_size
        if full <= req.num_cached_blocks:
            return
        if len(req.block_hashes) < full:
            req.block_hashes = chain_hashes(
                req.all_token_ids(), self.block_size, req.block_hashes, _root(req)
            )
        first = req.num_cached_blocks
        for b in range(first, full):
            self.pool.cache(req.blocks[b], req.block_hashes[b])
        if self.pool.records_events:
            size = self.block_size
            self.pool.record_stored(
                req.block_hashes[first:full],
                req.block_hashes[first - 1] if first else None,
                req.all_token_ids()[first * size : full * size],
                size,
                req.lora,
                req.lora_id,
            )
        req.num_cached_blocks = full

    def _sample(self, req: SimRequest, now: float) -> None:
        # The per-token hot path: kept flat, no property lookups.
        lm = self.lm
        tok = lm.next_token(req.lm_state)
        first = not req.output_ids
        req.output_ids.append(tok)
        req.num_tokens += 1
        req.lm_state = lm.push(req.lm_state, tok)
        self.counters.generation_tokens += 1
        if first:
            req.first_token_at = now
            self.counters.prompt_tokens += len(req.prompt_ids)
        self.listener.on_token(req, now, first)
        req.last_token_at = now

        params = req.params
        text = self._token_str(tok)
        finish: str | None = None
        stop_reason: int | str | None = None
        n_out = len(req.output_ids)
        if n_out >= params.min_tokens:
            if tok == EOS_ID and not params.ignore_eos:
                finish = "stop"
            elif params.stop_token_ids and tok in params.stop_token_ids:
                finish, stop_reason = "stop", tok
        if finish is None and (
            n_out >= params.max_tokens or req.num_tokens >= self.profile.max_model_len
        ):
            finish = "length"
        if params.stop:
            text, finish, stop_reason = self._stop_strings(req, text, finish, stop_reason)
        else:
            req.text_parts.append(text)
        if finish is None:
            req.stream.put(TokenEvent([tok], text))
            return
        self.running.remove(req)
        self._finish(req, finish, stop_reason, now, TokenEvent([tok], text))

    def _stop_strings(
        self, req: SimRequest, text: str, finish: str | None, stop_reason: int | str | None
    ) -> tuple[str, str | None, int | str | None]:
        """Cut the output at a stop string and hold back text that could begin one, as vLLM's
        detokenizer does, so a stream never shows part of a stop string. Returns the text
        to send now, and the finish reason (a stop string wins over length)."""
        params = req.params
        longest = max(len(s) for s in params.stop)
        before = req.output_text
        full = before + text
        if len(req.output_ids) >= params.min_tokens and (finish is None or finish == "length"):
            # Only a stop string that ends in the new text can be new.
            start = max(0, len(before) - longest + 1)
            found = [(at, s) for s in params.stop if (at := full.find(s, start)) >= 0]
            if found:
                at, s = min(found)
                full = full[: at + len(s) if params.include_stop_str_in_output else at]
                finish, stop_reason = "stop", s
        req.text_parts = [full]
        upto = (
            len(full) if finish is not None else max(req.emitted_chars, len(full) - (longest - 1))
        )
        out = full[req.emitted_chars : upto]
        req.emitted_chars = upto
        return out, finish, stop_reason

    def _finish(
        self,
        req: SimRequest,
        reason: str,
        stop_reason: int | str | None,
        now: float | None,
        event: TokenEvent | None = None,
    ) -> None:
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.stop_reason = stop_reason
        req.finished_at = now
        self.requests.pop(req.request_id, None)
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1
        if req.do_remote_decode and reason in ("stop", "length") and now is not None:
            self.held[req.request_id] = (req, now + self.hold_timeout_s)
        else:
            self.pool.free(req.blocks)
            req.blocks = []
        self.listener.on_finished(req)
        ev = event or TokenEvent([], "")
        ev.finish_reason = reason
        ev.stop_reason = stop_reason
        req.stream.put(ev)

    def iter_requests(self) -> Iterator[SimRequest]:
        return iter(self.requests.values())


def _root(req: SimRequest) -> BlockHash:
    """The hash chain's root: an adapter's blocks are its own, as vLLM salts them with it."""
    return ROOT_HASH if req.lora is None else hash((ROOT_HASH, req.lora))
