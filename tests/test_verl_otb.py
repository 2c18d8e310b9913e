"""--credit otb (comparisons/otb.py) against verl 0.9.1's own ``compute_optimal_token_baseline_advantage``
(``verl/trainer/ppo/core_algos.py``), imported, not copied.

Marker ``verl`` (needs tools/requirements-verl.txt; left out of the default run; ``.ci/run`` runs ``pytest -m verl``
in its own virtual environment). verl takes the reward per token (``token_level_rewards``: an outcome reward at the
response's last valid token, 0 elsewhere), the mask, each row's prompt ``index``, θ_old's log-probs, Σ_v π_v² and the
rollout IS weights ρ̄ (or None); ours takes r [N] and the rows grouped ``num_generations`` at a time, as grpo.py's batch
is. Both compute in their inputs' dtype: float64 here, equal to 1e-12 (the same sums in the same order).
"""

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.verl
D = torch.float64


@pytest.fixture(scope="module")
def verl_otb():
    pytest.importorskip("verl")  # in a fixture: the default run collects this file without a skip
    from verl.trainer.ppo import core_algos

    return core_algos.compute_optimal_token_baseline_advantage


def _batch(seed, groups, G, T, lengths=None, equal_groups=(), one_token=False):
    g = torch.Generator().manual_seed(seed)
    N = groups * G
    if lengths is None:
        lengths = torch.randint(1, T + 1, (N,), generator=g)
    lengths = torch.as_tensor(lengths)
    if one_token:
        lengths[1] = 1
    mask = (torch.arange(T)[None] < lengths[:, None]).to(D)  # right padding, unequal lengths
    logp = -torch.rand(N, T, generator=g, dtype=D) * 4
    sum_sq = torch.exp(logp) ** 2 + torch.rand(N, T, generator=g, dtype=D) * (1 - torch.exp(logp) ** 2)
    rewards = torch.randint(0, 2, (N,), generator=g).to(D)
    for k in equal_groups:  # a group whose rewards are all equal
        rewards[k * G : (k + 1) * G] = float(k % 2)
    rho = torch.rand(N, T, generator=g, dtype=D) * 1.5 + 0.2
    return rewards, mask, logp, sum_sq, rho, lengths


def _verl_inputs(rewards, mask, lengths, G):
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(rewards)), lengths - 1] = rewards  # the outcome reward at the last valid token
    index = np.repeat(np.arange(len(rewards) // G), G)  # each row's prompt
    return token_rewards, index


@pytest.mark.parametrize("with_rho", [False, True])
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_otb_equals_verls_compute_optimal_token_baseline_advantage(verl_otb, seed, zero_tail, with_rho):
    """Random groups of 4 with padding and unequal lengths, two groups whose rewards are all equal (0s, then 1s), a
    one-token response, with and without ρ̄: our Ã equals verl's advantages in float64 to 1e-12."""
    from comparisons import otb

    G = 4
    rewards, mask, logp, sum_sq, rho, lengths = _batch(seed, 5, G, 9, equal_groups=(0, 1), one_token=True)
    token_rewards, index = _verl_inputs(rewards, mask, lengths, G)
    weights = rho if with_rho else None
    theirs, returns = verl_otb(
        token_rewards, mask, index, logp, sum_sq, rollout_is_weights=weights, handle_zero_tail=zero_tail
    )
    ours = otb.optimal_token_baseline(rewards, mask, logp, sum_sq, G, weights, handle_zero_tail=zero_tail)
    assert theirs.dtype == D and bool((theirs != 0).any())
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    torch.testing.assert_close(returns * mask, rewards[:, None] * mask, rtol=0, atol=0)  # G_t = r_i: rewards-to-go
    ones = lengths[G : 2 * G].sort().values  # group 1: rewards all 1 (Â = 0)
    if zero_tail and ones[-1] > ones[-2]:  # its unique longest response beyond the second-longest: Ã = r = 1 there
        longest = G + int(lengths[G : 2 * G].argmax())
        assert torch.equal(ours[longest, int(ones[-2]) : int(ones[-1])], torch.ones(int(ones[-1] - ones[-2]), dtype=D))


def test_otb_equals_verl_on_ties_for_the_longest_and_a_group_of_one(verl_otb):
    """Two responses tied for the longest (no zero tail, as verl's ``max_length_idx.numel() == 1``) and group size 1
    (no baseline: Ã = G_t)."""
    from comparisons import otb

    rewards, mask, logp, sum_sq, _, lengths = _batch(7, 2, 3, 6, lengths=[6, 6, 2, 5, 1, 3])
    token_rewards, index = _verl_inputs(rewards, mask, lengths, 3)
    theirs, _ = verl_otb(token_rewards, mask, index, logp, sum_sq)
    torch.testing.assert_close(otb.optimal_token_baseline(rewards, mask, logp, sum_sq, 3), theirs, rtol=0, atol=1e-12)
    token_rewards, index = _verl_inputs(rewards, mask, lengths, 1)
    theirs, _ = verl_otb(token_rewards, mask, index, logp, sum_sq)
    torch.testing.assert_close(otb.optimal_token_baseline(rewards, mask, logp, sum_sq, 1), theirs, rtol=0, atol=1e-12)
