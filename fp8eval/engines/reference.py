"""The reference engine: transformers + torch with vLLM's FP8 KV cache emulated exactly.

Runs anywhere (CPU included). Compute happens in `engine.dtype` (float32 on CPU by default, where
bfloat16 matmuls are slow); what differs between arms is only what the KV cache stores: the model dtype
(bfloat16) for `kv_cache_dtype: auto`, FP8 with vLLM's scale/saturate/round semantics otherwise.
"""

from __future__ import annotations

import dataclasses
import time
from importlib import metadata
from typing import Iterable, Iterator

from fp8eval.config import (
    ACCUMULATION_MODES,
    ATTENTION_MODES,
    INT8_ROUNDINGS,
    KV_EMULATION_DEFAULTS,
    RunConfig,
    emulation_in_effect,
)
from fp8eval.core.hub import known_offline_reason
from fp8eval.core.progress import stage
from fp8eval.engines.base import Capabilities, Choice, Completion, EngineBase, EngineError, Request
from fp8eval.engines.prompting import check_template_kwargs, plain_prompt_text
from fp8eval.engines.spec import ArmSpec

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


class ReferenceEngine(EngineBase):
    kind = "reference"
    capabilities = Capabilities(
        distributions="hidden", switches_kv_policy=True, loglikelihood=True, teacher_force=True,
        prefill_chunking="engine", engine_fields=("prefill_chunk",),
        honoured_args=(("max_num_seqs", "batch_cap", "decodes a request's repeats in batches of at most max_num_seqs"),),
        control_hint="control=chunk, or control=batch1 / control=seed with sampled repeats", decode_path="probe")

    def __init__(self, cfg: RunConfig, arm: ArmSpec, shared: dict | None = None):
        self.cfg = cfg
        self.kv = kv = arm
        # Arms of one run share the loaded model (only the cache policy differs), keyed by model dir.
        self._shared = shared if shared is not None else {}
        if getattr(cfg.model, "dummy", False):
            raise EngineError("model.dummy=true (random weights) needs engine=vllm or engine=vllm_cpu: the reference "
                              "engine only runs real weights.")
        args = arm.engine_args
        self.cache_dtype = str(args.get("kv_cache_dtype", "auto"))
        from fp8eval.core.kvformats import REFERENCE_EMULATED as EMULATED  # no torch import here

        if self.cache_dtype not in ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", *EMULATED):
            raise EngineError(
                f"The reference engine emulates kv_cache_dtype auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, "
                f"{', '.join(EMULATED)}; {self.cache_dtype!r} was asked for by kv={kv.name}."
            )
        _check_emulation(kv)
        self.skip_layers = tuple(str(x) for x in (args.get("kv_cache_dtype_skip_layers") or []))
        self.model_dtype = str(args.get("dtype", "bfloat16"))
        self._scales = None
        if kv.scales:
            from fp8eval.scales import load_kv_scales

            self._scales = load_kv_scales(kv.scales)
            if self._scales.strategy != kv.scale_strategy:
                raise EngineError(
                    f"kv={kv.name} expects {kv.scale_strategy} scales but {kv.scales} holds "
                    f"{self._scales.strategy} scales."
                )
        elif kv.scale_strategy != "tensor":
            raise EngineError(
                f"kv={kv.name} needs a scales source with one scale per KV head: set kv.scales=PATH to a "
                f"scales JSON file or a calibrated checkpoint (make one with `python -m fp8eval.calibrate "
                f"model={cfg.model.name} calib.strategy=attn_head`)."
            )
        self._tok = None
        self._model = None
        self.knob_audit: dict | None = None
        self._policy = None
        # Prompt tokens actually run through the model (one prefill per request, whatever its n).
        self.computed_prefill_tokens = 0

    # --- describe ---------------------------------------------------------------------------------
    def describe(self) -> dict:
        m = self.cfg.model
        e = self.cfg.engine
        return {
            "kind": self.kind,
            "versions": {p: _version(p) for p in ("torch", "transformers", "gguf")},
            "model": {"hf_id": m.hf_id, "revision": m.revision, "embedded_package": m.embedded_package,
                      "embedded_version": _version(m.embedded_package.replace("_", "-"))
                      if m.embedded_package else None, "gguf_file": m.gguf_file,
                      "chat_template": m.chat_template},
            "compute_dtype": self._compute_dtype_name(),
            "device": self._device_name(),
            "prefill_chunk": e.prefill_chunk,
            "kv": {"cache_dtype": self.cache_dtype, "model_dtype": self.model_dtype,
                   "skip_layers": list(self.skip_layers),
                   "scales_source": self.kv.scales, "scales_sha256": self._scales.sha256 if self._scales else None,
                   "scale_strategy": self.kv.scale_strategy, "quantize_attention": self.kv.quantize_attention,
                   # only where they change a number: records made before these knobs keep their fingerprint
                   **emulation_in_effect({k: getattr(self.kv, k) for k in KV_EMULATION_DEFAULTS},
                                         self.cache_dtype)},
            "engine_args": dict(e.engine_args),
            # Reproducible CPU numerics (fp8eval/engines/cpu_numerics.py); absent on GPU, whose fingerprints stay.
            **({"cpu_numerics": _cpu_numerics()} if self._device_name() == "cpu" else {}),
        }

    def token_count_key(self) -> dict:
        """What a prompt's token count depends on: the tokenizer files and the code applying them."""
        m = self.cfg.model
        return {"hf_id": m.hf_id, "revision": m.revision, "embedded_package": m.embedded_package,
                "embedded_version": _version(m.embedded_package.replace("_", "-")) if m.embedded_package else None,
                "gguf_file": m.gguf_file, "chat_template": m.chat_template,
                "versions": {p: _version(p) for p in ("transformers", "tokenizers", "gguf")}}

    def prefill_stats(self) -> dict:
        return {"computed_prefill_tokens": int(self.computed_prefill_tokens)}

    def _device_name(self) -> str:
        dev = self.cfg.engine.device
        if dev != "auto":
            return dev
        if "+cpu" in (_version("torch") or ""):
            return "cpu"  # a CPU-only build: no need to import torch (~3 s) to learn that
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def _compute_dtype_name(self) -> str:
        d = self.cfg.engine.dtype
        if d != "auto":
            if d not in _DTYPES:
                raise EngineError(f"engine.dtype={d!r}; valid: auto, {', '.join(_DTYPES)}")
            return d
        return "bfloat16" if self._device_name() == "cuda" else "float32"

    def max_model_len(self) -> int:
        return int(self.cfg.model.max_model_len)

    # --- loading ------------------------------------------------------------------------------------
    def tokenizer(self):
        """The model's tokenizer, loaded once and shared between engines of one model directory (EngineError when it
        cannot be loaded)."""
        if self._tok is None:
            key = ("tok", self._model_dir())
            if key not in self._shared:
                from fp8eval.engines.hf_light import import_transformers

                import_transformers()  # without scikit-learn: ~1.5 s less start-up
                from transformers import AutoTokenizer

                try:
                    self._shared[key] = AutoTokenizer.from_pretrained(self._model_dir(),
                                                                      revision=self.cfg.model.revision)
                except (OSError, ValueError) as e:
                    raise EngineError(self._unavailable(e)) from e
            self._tok = self._shared[key]
        return self._tok

    def _unavailable(self, e: Exception) -> str:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        offline = known_offline_reason()
        if offline:
            first += f"; the model hub is not reachable here: {offline}"
        return (f"The reference engine could not load {self.cfg.model.hf_id!r} ({first}). Without access to "
                f"the model hub, download the weights elsewhere and point model.hf_id at that directory; on a GPU "
                f"box with vLLM installed, use engine=vllm (or engine=server). The embedded models "
                f"(model=smollm2-135m, model=gemma3-270m) need no hub.")

    def _model_dir(self):
        key = ("dir", self.cfg.model.name)
        if key not in self._shared:
            from fp8eval.models import ModelUnavailable, local_model_dir

            try:
                self._shared[key] = str(local_model_dir(self.cfg.model))
            except ModelUnavailable as e:
                raise EngineError(str(e)) from e
        return self._shared[key]

    def _load(self):
        if self._model is not None:
            return
        import torch

        from fp8eval.engines import kvcache

        if self.cfg.engine.threads:
            torch.set_num_threads(int(self.cfg.engine.threads))
        if self._device_name() == "cpu":
            from fp8eval.engines import cpu_numerics

            try:
                cpu_numerics.pin()  # the mode the fingerprint records (describe)
            except RuntimeError as e:
                raise EngineError(str(e)) from e
        key = ("model", self._model_dir(), self._compute_dtype_name(), self._device_name())
        if key not in self._shared:
            from transformers import AutoModelForCausalLM

            name = kvcache.register(lambda module: self._shared["active_policy"])
            with stage(f"loading {self.cfg.model.name} on {self._device_name()}", getattr(self.cfg, "progress", True)):
                try:
                    model = AutoModelForCausalLM.from_pretrained(
                        self._model_dir(), revision=self.cfg.model.revision,
                        dtype=getattr(torch, self._compute_dtype_name()), attn_implementation=name)
                except (OSError, ValueError) as e:
                    raise EngineError(self._unavailable(e)) from e
                model.to(self._device_name()).eval()
            self._shared[key] = model
        self._model = self._shared[key]
        scales = self._scales
        from fp8eval.core.kvformats import effective_skip_layers

        # TurboQuant keeps its boundary layers in BF16 by itself in vLLM (engine/arg_utils.py): the same here.
        n_layers = int(getattr(self._model.config.get_text_config(), "num_hidden_layers", 0) or 0)
        skip = tuple(effective_skip_layers(self.cache_dtype, list(self.skip_layers), n_layers)
                     if self.cache_dtype.startswith("turboquant_") else self.skip_layers)
        self._policy = kvcache.KVPolicy(
            cache_dtype=self.cache_dtype,
            model_dtype=getattr(torch, self.model_dtype if self.model_dtype != "auto" else "bfloat16"),
            skip_layers=skip,
            k_scales={i: t.to(self._device_name()) for i, t in scales.k.items()} if scales else {},
            v_scales={i: t.to(self._device_name()) for i, t in scales.v.items()} if scales else {},
            quantize_attention=self.kv.quantize_attention,
            attention=self.kv.attention,
            accumulation=self.kv.accumulation,
            int8_rounding=self.kv.int8_rounding,
            int4_rht=bool(self.kv.int4_rht),
            fa3_decode=bool(self.kv.fa3_decode),
        )
        from fp8eval.engines.audit.live import audit_reference

        self.knob_audit = audit_reference(self)  # refuses (AuditError) a policy that is not what the arm asks

    @property
    def kv_policy(self):
        """This arm's KV policy (`fp8eval.engines.kvcache.KVPolicy`), the model loaded first."""
        self._load()
        return self._policy

    def probe(self, policy=None):
        """The loaded model under `policy` (None: this arm's) as a context manager: per-position hidden states and
        logits of a token sequence (`fp8eval.engines.reference_probe.Probe`)."""
        from fp8eval.engines.reference_probe import open_probe

        return open_probe(self, policy)

    def audit_now(self) -> dict:
        """Load the model (if not yet) and return the knob audit of this arm's KV policy."""
        self._load()
        return self.knob_audit

    # --- prompts ------------------------------------------------------------------------------------
    def prompt_ids(self, request: Request) -> list[int]:
        """The prompt's token ids: plain text as is, messages through the chat template when the config and the
        tokenizer have one, else as plain text."""
        tok = self.tokenizer()
        if request.prompt_text is not None:
            return tok(request.prompt_text, add_special_tokens=True)["input_ids"]
        if self.cfg.model.chat_template and tok.chat_template:
            if request.chat_template_kwargs and not getattr(self, "_kwargs_checked", False):
                try:  # each switch must reach the rendered prompt (fp8eval.engines.prompting)
                    check_template_kwargs(tok, request.chat_template_kwargs)
                except ValueError as e:
                    raise EngineError(str(e)) from None
                self._kwargs_checked = True
            text = tok.apply_chat_template(list(request.messages), add_generation_prompt=True, tokenize=False,
                                           **request.chat_template_kwargs)
            return tok(text, add_special_tokens=False)["input_ids"]
        # A tokenizer without a template (the runner already sends plain text when the config says so).
        return tok(plain_prompt_text(request.messages), add_special_tokens=True)["input_ids"]

    def count_prompt_tokens(self, request: Request) -> int:
        return len(self.prompt_ids(request))

    # --- generation ---------------------------------------------------------------------------------
    def generate(self, requests: Iterable[Request]) -> Iterator[Completion]:
        return self._each(requests, self._generate_capped)

    def _generate_capped(self, req: Request) -> Completion:
        """`max_num_seqs` (a control arm's batch cap): a request's n sequences decoded in batches of at most that
        many, each sequence with its own seed as before, so only the batch shape differs."""
        cap = int((getattr(self.kv, "engine_args", None) or {}).get("max_num_seqs") or 0)
        if not cap or req.n <= cap:
            return self._generate_one(req)
        parts = [self._generate_one(dataclasses.replace(req, n=len(req.seeds[i:i + cap]), seeds=req.seeds[i:i + cap]))
                 for i in range(0, req.n, cap)]
        return dataclasses.replace(parts[0], choices=[c for p in parts for c in p.choices],
                                   latency_s=sum(p.latency_s for p in parts))

    def _each(self, requests: Iterable[Request], one) -> Iterator[Completion]:
        """One request at a time, under this arm's KV policy (the model is shared between arms)."""
        self._load()
        self._shared["active_policy"] = self._policy
        for req in requests:
            yield one(req)

    def _generate_one(self, req: Request) -> Completion:
        import torch

        from fp8eval.engines import step_logits
        from fp8eval.engines.sampling import sample_next

        t0 = time.perf_counter()
        tok = self.tokenizer()
        ids = self.prompt_ids(req)
        sp = req.sampling
        max_tokens = step_logits.request_max_tokens(req)
        if len(ids) + max_tokens > self.max_model_len():
            raise EngineError(f"request {req.id}: {len(ids)} prompt + {max_tokens} output tokens exceed "
                              f"max_model_len {self.max_model_len()} (the runner should have skipped it)")
        eos = _eos_ids(tok, self._model)
        stops = [s for s in (sp.get("stop") or []) if s]
        record = step_logits.recorder_for(self, req, ids, max_tokens)  # for the anatomy, or None
        with torch.inference_mode():
            cache, logits = self._prefill(ids, len(ids) + max_tokens)  # room for the request: no per-token concat
            n = req.n
            if n > 1:
                cache.batch_repeat_interleave(n)
                logits = logits.repeat(n, 1)
            gens = [torch.Generator(device="cpu").manual_seed(int(s)) for s in req.seeds]
            outs: list[list[int]] = [[] for _ in range(n)]
            finish: list[str | None] = [None] * n
            for step in range(max_tokens):
                if record is not None:
                    record.add(logits[0])
                nxt = sample_next(logits.float().cpu(), sp, gens)
                for i in range(n):
                    if finish[i] is not None:
                        continue
                    t = int(nxt[i])
                    if t in eos:
                        finish[i] = "stop"
                        continue
                    outs[i].append(t)
                    if stops and _hits_stop(tok, outs[i], stops):
                        finish[i] = "stop"
                if all(f is not None for f in finish) or step == max_tokens - 1:
                    break  # (after the last allowed token no logits are needed)
                logits = self._decode(cache, nxt.view(n, 1))
        if record is not None:
            record.keep(outs[0])
        choices = []
        for i in range(n):
            text = tok.decode(outs[i], skip_special_tokens=True)
            if finish[i] == "stop" and stops:
                text = _cut_at_stop(text, stops)
            choices.append(Choice(text=text, finish_reason=finish[i] or "length", output_tokens=len(outs[i])))
        # No cache across requests (cached 0); the n samples share this one prefill of len(ids) tokens.
        return Completion(request_id=req.id, choices=choices, prompt_tokens=len(ids), cached_prompt_tokens=0,
                          latency_s=time.perf_counter() - t0, extra={"computed_prompt_tokens": len(ids)})

    def _prefill(self, ids: list[int], capacity: int, count: bool = True):
        """(cache, last logits [1, vocab]): the prompt run in `engine.prefill_chunk` chunks into a reserved cache with
        room for `capacity` positions (call under torch.inference_mode); `count`: add them to computed_prefill_tokens."""
        import torch

        from fp8eval.engines.reserved_cache import reserved_cache

        cache = reserved_cache(self._model.config, capacity)
        input_ids = torch.tensor([ids], device=self._device_name())
        chunk = max(1, int(self.cfg.engine.prefill_chunk))
        logits = None
        for start in range(0, len(ids), chunk):
            out = self._model(input_ids=input_ids[:, start:start + chunk], past_key_values=cache, use_cache=True,
                              logits_to_keep=1)
            logits = out.logits[:, -1, :]
            if count:
                self.computed_prefill_tokens += min(chunk, len(ids) - start)
        return cache, logits

    def _decode(self, cache, tokens):
        """One decode step: tokens [n, 1] after what `cache` holds; returns the logits [n, vocab]."""
        out = self._model(input_ids=tokens.to(self._device_name()), past_key_values=cache, use_cache=True,
                          logits_to_keep=1)
        return out.logits[:, -1, :]

    # --- scoring (lm-eval loglikelihood) ---------------------------------------------------------------
    def loglikelihood(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """Scoring requests (fp8eval.engines.loglikelihood): one forward per (context, continuation), with the
        arm's KV policy, so the FP8 arm's context is read back from the quantized cache as in generation."""
        return self._each(requests, self._score_one)

    def _score_one(self, req: Request) -> Completion:
        import torch

        from fp8eval.engines import loglikelihood as ll

        t0 = time.perf_counter()
        tok = self.tokenizer()

        def encode(text: str) -> list[int]:
            return tok(text, add_special_tokens=False)["input_ids"]

        bos = ll.prefix_token_id(tok)
        encoded = [ll.encode_pair(encode, c, x, bos) for c, x in req.logprob_pairs]
        encoded = [(ctx or [bos], cont) for ctx, cont in encoded]
        ll.check_fits(req, (len(a) + len(b) for a, b in encoded), self.max_model_len())
        device = self._device_name()
        chunk = max(1, int(self.cfg.engine.prefill_chunk))
        pairs = []
        with torch.inference_mode():
            from transformers import DynamicCache

            for ctx, cont in encoded:
                if not cont:  # an empty continuation has probability 1, as in lm-eval
                    pairs.append((0.0, True))
                    continue
                ids = torch.tensor([ctx + cont], device=device)
                cache = DynamicCache(config=self._model.config)
                head = len(ctx) - 1  # tokens whose logits are not needed
                for start in range(0, head, chunk):
                    self._model(input_ids=ids[:, start:min(start + chunk, head)], past_key_values=cache,
                                use_cache=True, logits_to_keep=1)
                # The logits at the last context token and at each continuation token but the last.
                logits = self._model(input_ids=ids[:, head:-1], past_key_values=cache, use_cache=True).logits[0]
                logp = torch.log_softmax(logits.float(), dim=-1)
                target = torch.tensor(cont, device=logp.device)
                total = float(logp.gather(1, target.view(-1, 1)).sum())
                greedy = bool((logp.argmax(dim=-1) == target).all())
                pairs.append((total, greedy))
                self.computed_prefill_tokens += len(ctx) + len(cont) - 1
        prompt_tokens = sum(len(a) + len(b) for a, b in encoded)
        return ll.completion(req, pairs, prompt_tokens, time.perf_counter() - t0)

    # --- teacher forcing (the anatomy of a flip, fp8eval.engines.forcing) -------------------------------
    def teacher_force(self, req: Request, forced_text: str, other_text: str) -> dict:
        """The arm's logits after the prompt and the forced tokens before the parting position as its generation computes
        them (chunked prefill, then decode steps: step_logits.forced_logits), and the prefill view of that position."""
        import torch

        from fp8eval.engines import forcing, step_logits

        self._load()
        self._shared["active_policy"] = self._policy
        tok = self.tokenizer()
        prompt = self.prompt_ids(req)
        forced = tok(forced_text, add_special_tokens=False)["input_ids"]
        other = tok(other_text, add_special_tokens=False)["input_ids"]
        ids, p = forcing.forced_ids(forced, other, tok.eos_token_id)
        row = prefill = None
        if p < len(ids):
            row = forcing.row_from_logits(step_logits.forced_logits(self, req, prompt, ids[:p]), ids[p])
            with torch.inference_mode():  # the same position from one prefill of prompt + forced tokens (issue 35)
                prefill = forcing.row_from_logits(self._prefill(prompt + ids[:p], len(prompt) + p, count=False)[1][0], ids[p])
        return forcing.answer(p, forced, other, row, lambda t: tok.decode([t]), path="decode" if p else "prefill",
                              prefill=prefill if p else None)

    def close(self) -> None:
        self._model = None


def _cpu_numerics() -> dict:
    from fp8eval.engines import cpu_numerics

    return cpu_numerics.describe()


def _check_emulation(kv: ArmSpec) -> None:
    """Unknown kv.attention / kv.accumulation names fail here, with the valid ones."""
    if kv.attention not in ATTENTION_MODES:
        raise EngineError(f"kv.attention={kv.attention!r}; valid: {', '.join(ATTENTION_MODES)}")
    if kv.accumulation not in ACCUMULATION_MODES:
        raise EngineError(f"kv.accumulation={kv.accumulation!r}; valid: {', '.join(ACCUMULATION_MODES)}")
    if kv.int8_rounding not in INT8_ROUNDINGS:
        raise EngineError(f"kv.int8_rounding={kv.int8_rounding!r}; valid: {', '.join(INT8_ROUNDINGS)}")
    if kv.quantize_attention and kv.attention not in ("kv_only", "qp_unit_scale"):
        raise EngineError(f"kv.quantize_attention=true (the old name of kv.attention=qp_unit_scale) contradicts "
                          f"kv.attention={kv.attention}; set only kv.attention.")


def _eos_ids(tok, model) -> set[int]:
    ids = set()
    for src in (tok.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif src:
            ids.update(int(x) for x in src)
    return ids


def _hits_stop(tok, out_ids: list[int], stops: list[str]) -> bool:
    tail = tok.decode(out_ids[-16:], skip_special_tokens=True)
    return any(s in tail for s in stops)


def _cut_at_stop(text: str, stops: list[str]) -> str:
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    return text[:cut] if cut >= 0 else text
