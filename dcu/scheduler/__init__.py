"""vLLM-side code of patch 0004-scheduler-decode-first-adaptive-budget (opt-in; off = upstream scheduling).

Decode-first batching with a TPOT-targeted prefill budget, in three parts:

* ``options``: the tier presets (``--scheduler-preset``) and the startup checks of the options
  (``--scheduler-tpot-target-ms``, ``--scheduler-min-prefill-tokens``, ``--scheduler-tpot-cap-when``);
  called from the patch's hooks in ``EngineArgs`` and ``SchedulerConfig``;
* ``step_model``: the step-time model the budget learns (a linear model in six batch features, fitted by
  forgetting least squares with non-negative slopes);
* ``budget``: the policy (``TpotBudget``), which the patch's hooks in ``Scheduler`` create and call each step
  when the target is set (``make_tpot_budget`` returns None otherwise, and the scheduler runs upstream's code).

No vLLM import at module level: the three are unit-tested without a vLLM tree (tests/test_dcu_scheduler.py);
the scheduler integration runs against the patched tree (tests/test_scheduler_dcu.py). Every build carries this
package; only patch 0004's hooks import it.
"""
