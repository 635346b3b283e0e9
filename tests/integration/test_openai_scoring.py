"""Prompt scoring through /v1/completions (echo with logprobs), as evaluation harnesses use it:
lm-evaluation-harness (PyPI lm-eval, unmodified, pinned in requirements-test.txt) runs a
loglikelihood task defined here from a local JSONL file (no dataset hub is reachable) against the
server with its local-completions model and the server's tokenizer routes (/tokenize,
/detokenize, /tokenizer_info); each example's log-likelihood must equal the same sum computed in
process by the Python reference model (tools/tost_reference.py, float64) within 1e-4, and the
harness's accuracy the in-process one. Also: echo's shape on both prompt forms, streamed and not,
with and without generated tokens, and the bounds (a context-long prompt, a session)."""
import glob
import json
import math
import os
import subprocess
import sys

import httpx
import openai
import pytest
import torch

from conftest import PYLIB, SOURCE_DIR, openai_client

MODELS = os.path.join(SOURCE_DIR, "models")
MODEL = "tost-austen"
TOOLS = os.path.join(SOURCE_DIR, "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)
import bpe  # noqa: E402
import tost_reference as R  # noqa: E402

assert PYLIB  # conftest put tools/pylib on the path

# A multiple-choice task in Austen's words: the harness scores each choice as a continuation of
# the context (loglikelihood requests) and picks the likeliest.
DOCS = [
    {"context": "It is a truth universally acknowledged, that a single man in possession of a good",
     "choices": ["fortune", "horse", "umbrella"], "label": 0},
    {"context": "Mr. Darcy looked at Elizabeth, and she", "choices": ["smiled", "exploded", "multiplied"],
     "label": 0},
    {"context": "My dear Mr. Bennet, have you heard that Netherfield Park is let at", "choices": ["last", "noon"],
     "label": 0},
    {"context": "She was the youngest of the two daughters of a most affectionate, indulgent",
     "choices": ["father", "teapot", "volcano", "engine"], "label": 0},
    {"context": "Emma Woodhouse, handsome, clever, and", "choices": ["rich", "purple", "electric"], "label": 0},
    {"context": "The family of Dashwood had long been settled in", "choices": ["Sussex", "Jupiter"], "label": 0},
    {"context": "Anne Elliot had been forced into prudence in her youth, she learned", "choices": [
        "romance as she grew older", "algebra from a robot"], "label": 0},
    {"context": "No one who had ever seen Catherine Morland in her infancy would have supposed her born to be an",
     "choices": ["heroine", "astronaut", "accountant"], "label": 0},
]

TASK = "tost_austen_choice"


client = openai_client


@pytest.fixture(scope="module")
def reference():
    model, _ = R.load_model(os.path.join(MODELS, MODEL), dtype=torch.float64)
    tokenizer = bpe.Tokenizer.load(os.path.join(MODELS, MODEL, "tokenizer.json"))
    return model, tokenizer


def prompt_logprobs(model, ids):
    """log p(ids[i] | ids[:i]) for i >= 1, in float64."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0]
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]


def encode_pair(tokenizer, context, continuation):
    """lm-evaluation-harness's split of a (context, continuation) pair into tokens: trailing spaces
    move to the continuation, the whole is encoded and the context's tokens cut off its front."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = tokenizer.encode((context + continuation).encode())
    ctx = tokenizer.encode(context.encode())
    return ctx, whole[len(ctx):]


def test_echo_scores_the_prompt_as_the_reference_model(srv, reference):
    model, tokenizer = reference
    text = "It is a truth universally acknowledged, that a single man"
    ids = tokenizer.encode(text.encode())
    want = prompt_logprobs(model, ids)
    for prompt in (text, ids):
        r = client(srv).completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=2, max_tokens=0)
        (choice,) = r.choices
        assert choice.text == text and choice.finish_reason == "length"
        lp = choice.logprobs
        assert lp.tokens == [tokenizer.token_bytes(t).decode() for t in ids]
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(abs(a - b) < 1e-4 for a, b in zip(lp.token_logprobs[1:], want)), (lp.token_logprobs, want)
        assert all(len(top) == 2 and max(top.values()) >= own for top, own in
                   zip(lp.top_logprobs[1:], lp.token_logprobs[1:]))
        assert lp.text_offset[0] == 0 and lp.text_offset[-1] == text.rindex(" ")
        assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0


def test_echo_then_generation_streamed_and_not(srv):
    c = client(srv)
    kw = dict(model=MODEL, prompt="Pride and", echo=True, logprobs=1, max_tokens=5, seed=3)
    whole = c.completions.create(**kw)
    (choice,) = whole.choices
    assert choice.text.startswith("Pride and") and len(choice.text) > len("Pride and")
    assert len(choice.logprobs.tokens) == whole.usage.prompt_tokens + 5
    chunks = list(c.completions.create(**kw, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == choice.text
    first = chunks[0].choices[0]
    assert first.text == "Pride and" and first.logprobs.token_logprobs[0] is None
    plain = c.completions.create(model=MODEL, prompt="Pride and", echo=True, max_tokens=5, seed=3).choices[0]
    assert plain.text == choice.text and plain.logprobs is None


def test_echo_bounds(srv):
    c = client(srv)
    with pytest.raises(openai.BadRequestError) as e:  # a prompt past the context length
        c.completions.create(model=MODEL, prompt=[65] * 1025, echo=True, logprobs=0, max_tokens=0)
    assert e.value.body["param"] == "prompt" and "at most 1024 tokens" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt=[65, 2048], echo=True, logprobs=0, max_tokens=0)
    assert e.value.body["param"] == "prompt[1]"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="x", echo=True, max_tokens=0, extra_body={"session_id": "s"})
    assert e.value.body["param"] == "echo"
    with pytest.raises(openai.BadRequestError) as e:  # max_tokens 0 only with echo
        c.completions.create(model=MODEL, prompt="x", max_tokens=0)
    assert e.value.body["param"] == "max_tokens"
    # A context-long prompt is scored whole, and the server still serves.
    r = c.completions.create(model=MODEL, prompt=[65] * 1024, echo=True, logprobs=0, max_tokens=0)
    assert len(r.choices[0].logprobs.token_logprobs) == 1024
    assert c.completions.create(model=MODEL, prompt="Emma", max_tokens=2).choices[0].text


def test_lm_evaluation_harness_loglikelihood_task(srv, reference, tmp_path):
    model, tokenizer = reference
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / f"{TASK}.yaml").write_text(f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""")
    out = tmp_path / "out"
    base_url = f"http://127.0.0.1:{srv.http_port}/v1/completions"
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
           "--model_args", f"model={MODEL},base_url={base_url},tokenizer_backend=remote,num_concurrent=1,"
                           "max_retries=1",
           "--tasks", TASK, "--include_path", str(tasks), "--output_path", str(out), "--log_samples"]
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               OPENAI_API_KEY="none")
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (results_file,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    (samples_file,) = glob.glob(str(out / "**" / f"samples_{TASK}_*.jsonl"), recursive=True)
    harness_acc = json.load(open(results_file))["results"][TASK]["acc,none"]
    samples = [json.loads(line) for line in open(samples_file)]
    assert len(samples) == len(DOCS)

    correct, worst = 0, 0.0
    for s in samples:
        doc = s["doc"]
        ours = []
        # The samples file writes each request's arguments as {"gen_args_i": {"arg_0": context,
        # "arg_1": continuation}} and each response's numbers as strings.
        args = [s["arguments"][f"gen_args_{i}"] for i in range(len(s["arguments"]))]
        for a, (ll, _) in zip(args, s["filtered_resps"], strict=True):
            ctx, cont, ll = a["arg_0"], a["arg_1"], float(ll)
            ctx_ids, cont_ids = encode_pair(tokenizer, ctx, cont)
            want = sum(prompt_logprobs(model, ctx_ids + cont_ids)[len(ctx_ids) - 1:])
            assert math.isclose(ll, want, abs_tol=1e-4), (ctx, cont, ll, want)
            worst = max(worst, abs(ll - want))
            ours.append(want)
        best = max(range(len(ours)), key=lambda i: (ours[i], -i))
        correct += best == doc["label"]
        assert s["acc"] == float(best == doc["label"]), s
    assert harness_acc == correct / len(DOCS)
    print(f"lm-eval {TASK}: acc {harness_acc} over {len(DOCS)} examples; "
          f"{sum(len(s['arguments']) for s in samples)} log-likelihoods, at most {worst:.2e} from the reference")


def test_model_by_id_and_the_tokenizer_routes(srv, reference):
    _, tokenizer = reference
    c = client(srv)
    m = c.models.retrieve(MODEL)
    assert m.id == MODEL and m.owned_by == "tost-serve"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert e.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as e:  # a classifier: served, but not here
        c.models.retrieve("tost-digits")
    assert "classifier" in e.value.body["message"]
    base = f"http://127.0.0.1:{srv.http_port}"
    text = "It is a truth universally acknowledged"
    r = httpx.post(f"{base}/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
    assert r["tokens"] == tokenizer.encode(text.encode()) and r["count"] == len(r["tokens"])
    assert httpx.post(f"{base}/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": text}
    info = httpx.get(f"{base}/tokenizer_info").json()
    assert info["model_max_length"] == 1024 and info["vocab_size"] == 2048 and "eos_token" in info
    bad = httpx.post(f"{base}/detokenize", json={"tokens": [1, 5000]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[1]"
