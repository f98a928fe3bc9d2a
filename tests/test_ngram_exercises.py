"""Chapter 3's exercises: each check accepts the library's answer and rejects a planted wrong one, and the rules
the checks hold answers to agree with the chapter's specification (``reference_ngram_match``)."""

import pytest

from book.ngram import exercises as ex
from book.ngram import solutions as sol
from studylog import ngram
from studylog.ngram import NgramConfig


def test_checks_accept_the_library_answers(capsys):
    assert ex.check_match_key(ngram.match_key)
    assert ex.check_one_pass(sol.one_pass)
    assert ex.check_budget_scan(sol.budget_scan)
    assert ex.check_refused_bound(sol.refused_bound)
    assert capsys.readouterr().out.count("right on all") == 4


def _serial_budget_with_room_one(threshold, kinds, counted, bases, wants):
    """The serial rule with the off-by-one of the published BlockScan: room for one draft grants it."""
    left, done, out = sum(counted), 0, []
    for kind, base, want in zip(kinds, bases, wants):
        if kind == "keep":
            final = base
        elif kind == "zero":
            final = 0
        else:
            left -= 1
            room = threshold - done - base - left
            final = base + (min(want, room) if room >= 1 else 0)
        out.append(final)
        done += final
    return out


def _window_without_continuation(hay, hay_len, gen, top_n, min_n):
    """The per-n search that also takes a window at the very end of the haystack (no token after it)."""
    for n in range(top_n, min_n - 1, -1):
        for start in range(hay_len - n + 1):
            if hay[start:start + n] == gen[len(gen) - n:]:
                return n, start
    return None


@pytest.mark.parametrize("check, wrong, says", [
    (ex.check_match_key, lambda n, s, x: ((ngram.NGRAM_MAX - n) << 33) | (x << 1) | s, "is the better match"),
    (ex.check_match_key, lambda n, s, x: (1 << 64) - 1, "no match"),
    (ex.check_one_pass, lambda h, hl, g, t, m: ex.best_window(h, min(hl + 1, len(h)), g, t, m), "expected"),
    (ex.check_one_pass, lambda h, hl, g, t, m: _window_without_continuation(h, hl, g, t, m), "expected"),
    (ex.check_budget_scan, _serial_budget_with_room_one, "expected"),
    (ex.check_budget_scan, lambda th, k, c, b, w: [x + (kk == "active") * ww for x, kk, ww in zip(b, k, w)],
     "expected"),  # no budget at all
    (ex.check_refused_bound, lambda th, k, c, b: sol.refused_bound(th + 1, k, c, b), "too weak"),
    (ex.check_refused_bound, lambda th, k, c, b: [kind == "active" for kind in k], "unsafe"),
    (ex.check_refused_bound, lambda th, k, c, b: 1 / 0, "ZeroDivisionError"),
])
def test_checks_reject_a_planted_wrong_answer(check, wrong, says, capsys):
    assert not check(wrong, trials=400)
    assert says in capsys.readouterr().out


def test_the_rules_agree_with_the_specification():
    """sequential_budget of budget_facts is the reference's seq_lens_this_time; best_window and one_pass give the
    prompt's match of the one-pass model wherever the prompt has one."""
    for seed in range(120):
        hybrid = seed % 3 == 0
        inputs, draft, this_time = ngram.make_batch(12, 60, 24, vocab=4, seed=seed, decoys=True, capped_fraction=0.3,
                                                    hybrid=hybrid)
        config = NgramConfig(3, 1 + seed % 2, [0, 2, 5, 12, 30, 1 << 30][seed % 6], hybrid, 6 if hybrid else 10)
        _, expected = ngram.reference_ngram_match(inputs, draft, this_time, config)
        facts = ex.budget_facts(inputs, this_time, config)
        assert ex.sequential_budget(config.threshold, *facts) == expected.tolist(), seed
        assert sol.budget_scan(config.threshold, *facts) == expected.tolist(), seed
        refused = sol.refused_bound(config.threshold, *facts[:3])
        assert refused == ngram.model_budget_refused(inputs, config, this_time), seed
        keys = ngram.model_one_pass_keys(inputs, config, this_time)
        for b, key in enumerate(keys):
            if key == ngram.formats.NONE_KEY or ngram.models.decode_key(key)[1] != 0:
                continue  # no match, or a match in the generated tokens only
            step = int(inputs.step_idx[b])
            gen = inputs.generated_ids[b, :step + 1].tolist()
            top = min(config.max_ngram_size, step)
            args = (inputs.prompt_ids[b].tolist(), int(inputs.prompt_lens[b]), gen, top, config.min_ngram_size)
            n, _, start = ngram.models.decode_key(key)
            assert ex.best_window(*args) == sol.one_pass(*args) == (n, start), (seed, b)


def test_the_checks_are_fast():
    import time

    t0 = time.perf_counter()
    for check, answer in ((ex.check_match_key, ngram.match_key), (ex.check_one_pass, sol.one_pass),
                          (ex.check_budget_scan, sol.budget_scan), (ex.check_refused_bound, sol.refused_bound)):
        check(answer)
    assert time.perf_counter() - t0 < 20  # seconds, on a slow shared CPU; about one on a laptop


def _warp_min_without_warp_ops(source):
    """A planted non-answer: a comment added, nothing changed in the machine code."""
    return source.replace("extern \"C\" __global__ void ngram_one_pass_split", "// changed\nextern \"C\" __global__ "
                          "void ngram_one_pass_split")


@pytest.mark.parametrize("wrong, says", [
    (lambda source: source, "unchanged"),
    (_warp_min_without_warp_ops, "no warp-level minimum"),
    (lambda source: source.replace("ngram_one_pass_split", "ngram_split_renamed"), "does not compile to a kernel"),
    (lambda source: sol.warp_min_step6(source).replace("const u64 warp_best", "u64 warp_best = ;\n"), "compile"),
])
def test_the_kernel_exercise_rejects_a_planted_wrong_answer(wrong, says, capsys):
    assert not ex.check_warp_min(wrong)
    assert says in capsys.readouterr().out


def test_the_kernel_exercise_accepts_the_answer(capsys):
    """On a CPU the check compiles the answer and reads its PTX (the GPU part says it was skipped); on a GPU it
    also runs it against the specification."""
    import torch

    assert ex.check_warp_min(sol.warp_min_step6)
    out = capsys.readouterr().out
    assert "warp-level instructions" in out
    assert ("no GPU" in out) is not torch.cuda.is_available()
    ptx = __import__("studylog.cuda", fromlist=["compile_source"]).compile_source(
        sol.warp_min_step6(ex.step6_source()), name="answer.cu").ptx_function(ex.STEP6_KERNEL)
    assert "redux.sync.min.u32" in ptx


def _no_stop_keeping_the_read(source):
    """A planted non-answer: the stop's test goes, the read of the slot's key each tile stays."""
    return source.replace(sol.STEP11_STOP, "                if (tile > last_end) break;")


@pytest.mark.parametrize("wrong, says", [
    (lambda source: source, "unchanged"),
    (lambda source: source.replace("#include", "// changed\n#include", 1), "the read each tile is still there"),
    (_no_stop_keeping_the_read, "the read each tile is still there"),
    (lambda source: source.replace("ngram_stream(NGRAM_KERNEL_PARAMS)", "ngram_renamed(NGRAM_KERNEL_PARAMS)"),
     "does not compile"),
    (lambda source: sol.no_stop_step12(source).replace("if (tile > last_end) break;", "if (tile > ) break;"),
     "does not compile"),
])
def test_the_stop_exercise_rejects_a_planted_wrong_answer(wrong, says, capsys):
    assert not ex.check_no_stop(wrong)
    assert says in capsys.readouterr().out


def test_the_stop_exercise_accepts_the_answer(capsys):
    """On a CPU the check compiles the answer and reads its PTX (the GPU part says it was skipped); on a GPU it
    also runs it against the specification. The answer is the lab's variant without the stop, which the page
    times: the same two lines go."""
    import torch

    from studylog import paths

    assert ex.check_no_stop(sol.no_stop_step12)
    out = capsys.readouterr().out
    assert "reads the slot's key" in out and ("no GPU" in out) is not torch.cuda.is_available()
    variant = (paths.REPO_ROOT / "lab" / "ngram" / "variants" / "step12_changes.cu").read_text()
    assert "if constexpr (EXIT) seen = load_shared_key(match_keys + b);" in variant
    assert "if (EXIT && seen <= tile_floor_key(top, src, tile)) break;" in variant
