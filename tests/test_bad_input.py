"""What the optimizers say to a caller who gets their arguments wrong: a clear error at
construction (or at ``load_state_dict``) that names the bad value, where torch.optim would
raise from deep inside, later, or not at all."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import spectra.optim as so

#: Every optimizer class a caller builds from parameters.
BUILDERS = {
    "AdamW": lambda ps: so.AdamW(ps, lr=1e-2),
    "AdEMAMix": lambda ps: so.AdEMAMix(ps, lr=1e-2),
    "MARS": lambda ps: so.MARS(ps, lr=1e-2),
    "SGDM": lambda ps: so.SGDM(ps, lr=1e-2),
    "Signum": lambda ps: so.Signum(ps, lr=1e-2),
    "DMuon": lambda ps: so.DMuon(ps, lr=1e-2),
    "SOAP": lambda ps: so.SOAP(ps, lr=1e-2),
    "Spectra": lambda ps: so.Spectra(torch.optim.AdamW(ps, lr=1e-2)),
}
#: The same, where the wrapper's torch base would see the argument first.
NATIVE = {k: v for k, v in BUILDERS.items() if k != "Spectra"}


def params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).requires_grad_() for s in [(5, 4), (4,)]]


def step(opt: torch.optim.Optimizer, ps: list[torch.Tensor]) -> None:
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()


@pytest.mark.parametrize("name", list(NATIVE))
def test_a_module_or_a_dict_as_params_is_named(name):
    with pytest.raises(TypeError, match=r"got the module Linear; pass its \.parameters\(\)"):
        NATIVE[name](nn.Linear(3, 2))
    group = {"params": params(), "lr": 0.1}
    with pytest.raises(TypeError, match=r"got a dict with keys 'params', 'lr'; pass \[that dict\]"):
        NATIVE[name](group)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_group_without_params_is_named(name):
    message = r"param group 1 must be a dict with 'params'.*\['lr'\]"
    if name != "Spectra":  # the wrapper's base is torch's, built before it
        with pytest.raises(ValueError, match=message):
            BUILDERS[name]([{"params": params()}, {"lr": 0.1}])
    with pytest.raises(ValueError, match=message):
        BUILDERS[name](params()).add_param_group({"lr": 0.1})


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_parameter_listed_twice_is_refused_by_its_index(name):
    ps = params()
    message = r"parameter 2 of its group \(shape \(5, 4\)\) is parameter 0 again"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and not after torch's warning about it
        if name == "Spectra":
            opt = BUILDERS[name](params())
            with pytest.raises(ValueError, match=message):
                opt.add_param_group({"params": [*ps, ps[0]]})
        else:
            with pytest.raises(ValueError, match=message):
                BUILDERS[name]([*ps, ps[0]])


def test_a_step_never_takes_a_parameter_twice():
    # torch's own AdamW only warns, and steps the parameter twice
    p = torch.ones(3, 2, requires_grad=True)
    with pytest.raises(ValueError, match="is parameter 0 again; list each parameter once"):
        so.AdamW([p, p])


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_an_integer_parameter_is_refused(name, dtype):
    bad = torch.zeros(3, 2, dtype=dtype)
    message = rf"takes floating-point parameters; parameter 1 of its group is {dtype}"
    with pytest.raises(ValueError, match=message):
        BUILDERS[name]([params()[0], bad])


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_group_that_fails_a_check_is_not_added(name):
    ps = params()
    opt = BUILDERS[name](ps)
    with pytest.raises(ValueError, match="-1"):
        opt.add_param_group({"params": [torch.randn(3, 3, requires_grad=True)], "lr": -1.0})
    with pytest.raises(ValueError, match="floating-point"):
        opt.add_param_group({"params": [torch.zeros(3, dtype=torch.long)]})
    assert len(opt.param_groups) == 1
    if name == "Spectra":
        assert len(opt.base.param_groups) == 1
    step(opt, ps)  # steps as before


@pytest.mark.parametrize("name", ["AdamW", "MARS", "Spectra"])
def test_a_misspelt_group_setting_warns_and_other_keys_do_not(name):
    with pytest.warns(UserWarning, match=r"'clip_cc' is not a setting \(did you mean 'clip_c'"):
        BUILDERS[name]([{"params": params(), "clip_cc": 1.0}])
    opt = BUILDERS[name](params())
    with pytest.warns(UserWarning, match=r"'Clip_C' is not a setting .* it stays 10\.0") as seen:
        opt.add_param_group({"params": [torch.randn(3, 3, requires_grad=True)], "Clip_C": 1.0})
    assert seen[0].filename == __file__  # the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        BUILDERS[name]([{"params": params(), "name": "blocks", "initial_lr": 0.1, "group": "x"}])


def test_the_wrapper_refuses_a_base_that_needs_a_closure():
    with pytest.raises(ValueError, match=r"base_optimizer LBFGS needs a closure in step\(\)"):
        so.Spectra(torch.optim.LBFGS(params()))


# --------------------------------------------------------------------------- load_state_dict


@pytest.mark.parametrize(
    ("saved", "loaded", "missing", "held"),
    [
        ("Signum", "AdamW", "'exp_avg', 'exp_avg_sq'", "'momentum_buffer', 'step'"),
        ("AdamW", "Signum", "'momentum_buffer'", "'exp_avg', 'exp_avg_sq', 'step'"),
        ("AdamW", "MARS", "'last_grad'", "'exp_avg', 'exp_avg_sq', 'step'"),
        ("Spectra", "AdEMAMix", "'exp_avg_fast', 'exp_avg_slow', 'exp_avg_sq'", "'step'"),
    ],
)
def test_another_optimizers_state_is_refused_before_anything_loads(saved, loaded, missing, held):
    ps = params()
    source = BUILDERS[saved](ps)
    step(source, ps)
    target = BUILDERS[loaded](ps)
    step(target, ps)
    before = {k: v.clone() for k, v in target.state[ps[0]].items()}
    with pytest.raises(ValueError) as caught:
        target.load_state_dict(source.state_dict())
    assert str(caught.value) == (
        f"{loaded}.load_state_dict: the saved state of parameter 0 of group 0 (shape (5, 4)) has "
        f"no {missing} (it holds {held}): it was saved by another optimizer"
    )
    assert all(torch.equal(v, before[k]) for k, v in target.state[ps[0]].items())


def test_torch_sgd_state_lacks_the_step_count():
    ps = params()
    source = torch.optim.SGD(ps, lr=0.1, momentum=0.9)
    step(source, ps)
    with pytest.raises(ValueError, match=r"has no 'step' \(it holds 'momentum_buffer'\)"):
        so.SGDM(ps).load_state_dict(source.state_dict())


def test_torch_adamw_state_still_loads():
    ps = params()
    source = torch.optim.AdamW(ps, lr=1e-2)
    step(source, ps)
    target = so.AdamW(ps, lr=1e-2)
    target.load_state_dict(source.state_dict())
    step(target, ps)
    assert int(target.state[ps[0]]["step"]) == 2


def test_a_state_for_other_parameters_is_refused():
    source_ps = [torch.randn(4, 5, requires_grad=True), torch.randn(4, requires_grad=True)]
    source = so.AdamW(source_ps)
    step(source, source_ps)
    with pytest.raises(ValueError, match=r"has 'exp_avg' of shape \(4, 5\): it was saved for"):
        so.AdamW(params()).load_state_dict(source.state_dict())


def test_something_else_than_a_state_dict_is_named():
    with pytest.raises(ValueError, match=r"a dict with 'state' and 'param_groups', got keys \['a'"):
        so.AdamW(params()).load_state_dict({"a": 1})
    with pytest.raises(ValueError, match="'param_groups', got list"):
        so.AdamW(params()).load_state_dict([])


def test_the_wrapper_says_how_to_load_its_bases_own_state():
    ps = params()
    source = torch.optim.AdamW(ps, lr=1e-2)
    step(source, ps)
    wrapper = so.Spectra(torch.optim.AdamW(ps, lr=1e-2), clip_c=0.5)
    with pytest.raises(ValueError, match=r"no 'base_state'.*spectra_optimizer\.base\.load_state"):
        wrapper.load_state_dict(source.state_dict())
    wrapper.base.load_state_dict(source.state_dict())  # as the message says
    step(wrapper, ps)
    # each parameter took one more step of the base, with the wrapper's settings
    assert [int(wrapper.base.state[p]["step"]) for p in ps] == [2, 2]
    assert wrapper.param_groups is wrapper.base.param_groups
    assert wrapper.param_groups[0]["clip_c"] == 0.5


def test_the_wrapper_follows_its_bases_new_groups():
    # base.load_state_dict replaces the base's param_groups: the wrapper steps with the new
    # ones (each parameter once per step) and keeps its own settings
    ps = params()
    wrapper = so.Spectra(torch.optim.AdamW(ps, lr=1e-2), clip_c=0.5)
    reference = so.Spectra(torch.optim.AdamW([p.detach().clone().requires_grad_() for p in ps],
                                             lr=1e-2), clip_c=0.5)  # fmt: skip
    refs = [p for g in reference.param_groups for p in g["params"]]
    step(wrapper, ps)
    step(reference, refs)
    wrapper.base.load_state_dict(wrapper.base.state_dict())
    for _ in range(2):
        step(wrapper, ps)
        step(reference, refs)
    for a, b in zip(ps, refs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert [int(wrapper.base.state[p]["step"]) for p in ps] == [3, 3]
