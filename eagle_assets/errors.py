"""The project's one error tree: every error eagle-forge raises on purpose derives from ``EagleForgeError``.

Why one tree: a caller (an asset, the demo, a test) can tell "the project refused, and the message says
what to do" from "something broke" with one ``except``, and the one place that turns project errors into
Dagster failures (``eagle_assets.assets.failures``) decides by class, not by a list of names. Each
concrete class keeps the standard-library base it had before the tree existed as a second base
(``class DatasetConfigError(ConfigError, ValueError)``), so every ``except ValueError`` written before
still catches what it caught.

``Resumable`` marks the stops after which the work done is kept and a rerun continues where it stopped
(a lost lease); the failure mapping lets those through untouched, as they always went. Everything
else is final for this run: the mapping turns it into ``dagster.Failure(allow_retries=False)``.

``Systemic`` marks the causes that fail every partition alike (a setting, the target's tokenizer files,
the simulator that cannot start, a provider policy that leaves no endpoint, an account call refused):
after one of them, trying the next partition only repeats it, so the demo stops at the first. It says
nothing more to Dagster: a systemic error is final like the others.

This module is a leaf: it imports nothing from the project, so ``resources/`` may import it as well.

The hierarchy (``*`` marks classes defined in the modules named, not here)::

    EagleForgeError
    ├── ConfigError                     a setting, file or variable names nothing usable
    │   ├── BudgetModeError *           eagle_assets/budget_mode.py
    │   ├── DatasetConfigError *        eagle_assets/datasets/config.py
    │   ├── RegenerationModeError *     eagle_assets/datasets/regeneration.py
    │   ├── DatabaseConfigError *       eagle_assets/generation/ledger/database.py
    │   │   └── SQLiteLedgerRefused *   eagle_assets/generation/ledger/database.py
    │   ├── AccountSettingsConflict *   eagle_assets/generation/ledger/account.py
    │   ├── ServingConfigError *        resources/serving/resource.py
    │   ├── MissingApiKeyError *        resources/openrouter/secret.py
    │   ├── EnvSettingError *           eagle_assets/settings.py
    │   ├── SettingsError *             resources/serving/commands.py
    │   └── VLLMUnavailableError *      eagle_assets/hidden_states/extract_vllm.py
    ├── DataError                       the input data cannot be used as it is
    │   ├── PromptFileError *           eagle_assets/datasets/file_readers.py
    │   │   └── HubSourceError *        eagle_assets/datasets/hub_source.py
    │   ├── DatasetQualityError *       eagle_assets/datasets/dataset_scan.py
    │   ├── FormatError *               eagle_assets/datasets/formats.py
    │   ├── RowError *                  eagle_assets/datasets/formats.py
    │   ├── EmptyPartitionError *       eagle_assets/generation/partition_inputs.py
    │   ├── ShardMovedError *           eagle_assets/generation/shard_identity.py
    │   └── PromptSetError *            eagle_assets/benchmarks/prompt_sets.py
    ├── GenerationError                 the journal, the budget ledger or the plan refuse to go on
    │   ├── JournalError *              eagle_assets/generation/journal.py
    │   │   ├── JournalLockedError *    eagle_assets/generation/journal.py
    │   │   │   └── PartitionBusyError *  eagle_assets/generation/partition_fence.py
    │   │   └── FenceLostError *        eagle_assets/generation/partition_fence.py (also a LeaseLost)
    │   ├── LeaseLost                   this run's lease was lost: stop now, rerun to continue
    │   │   ├── LedgerLeaseLost *       eagle_assets/generation/ledger/owners.py
    │   │   ├── LeaseLostError *        eagle_assets/generation/database_lease.py
    │   │   └── FenceLostError *        (see above)
    │   ├── LeaseBusyError *            eagle_assets/generation/database_lease.py
    │   ├── LedgerConnectionLost *      eagle_assets/generation/ledger/database.py
    │   ├── LedgerDatabaseUnavailable *  eagle_assets/generation/ledger/database.py (also Systemic)
    │   ├── PlanInputError *            eagle_assets/generation/plan.py
    │   └── PlanRefusal *               eagle_assets/generation/plan.py
    ├── Resumable                       the work is kept and a rerun continues: not turned into a Failure
    │   └── LeaseLost                   (see above)
    ├── Systemic                        the same cause fails every partition alike: the demo stops at the first
    │   ├── ConfigError                 (see above: every setting error)
    │   ├── TokenizerFilesError         (see below)
    │   ├── TokenizerIntegrityError     (see below)
    │   ├── TargetLoadError             (see below)
    │   ├── OpenRouterHTTPError         (see below)
    │   ├── NoAllowedProviderError      (see below)
    │   ├── EmbeddedSimulatorError      (see below)
    │   ├── StateFileError              (see below)
    │   └── LedgerDatabaseUnavailable   (see above)
    ├── OpenRouterError                 the OpenRouter account, its providers, or the bundled simulator
    │   ├── OpenRouterHTTPError *       resources/openrouter/client.py
    │   ├── NoAllowedProviderError *    resources/openrouter/providers.py
    │   ├── EmbeddedSimulatorError *    resources/simulator/embedded.py
    │   ├── StateFileError *            resources/simulator/state.py
    │   └── PromptRenderError *         resources/simulator/responses.py
    ├── TargetError                     the target model's tokenizer, chat template or hidden states
    │   ├── TokenizerFilesError *       eagle_assets/tokenization/tokenizer_source.py
    │   ├── TokenizerIntegrityError *   eagle_assets/tokenization/tokenizer_source.py
    │   ├── ChatEncodingError *         eagle_assets/tokenization/chat_encoding.py
    │   ├── TargetLoadError *           eagle_assets/target/loader.py (also Systemic)
    │   ├── ToolDeclarationError *      eagle_assets/tokenization/tool_declaration.py
    │   ├── VLLMHandoffError *          eagle_assets/hidden_states/extract_vllm.py
    │   │   └── VLLMEngineDiedError *   eagle_assets/hidden_states/extract_vllm.py
    │   ├── CalibrationResponseError *  eagle_assets/hidden_states/calibration_engine.py
    │   ├── CalibrationMismatchError *  eagle_assets/hidden_states/calibration_engine.py
    │   ├── OnlineFidelityError *       eagle_assets/hidden_states/online_fidelity.py
    │   └── StoreError *                eagle_assets/hidden_states/store_format.py
    │       ├── StoreMismatchError *    eagle_assets/hidden_states/store_format.py
    │       └── InsufficientDiskError * eagle_assets/hidden_states/store_format.py
    └── EngineError                     a serving engine (SGLang, vLLM) or what the benchmark read from it
        ├── ServingError *              resources/serving/errors.py
        │   ├── ServerStartError *      resources/serving/errors.py
        │   ├── ServerDiedError *       resources/serving/errors.py
        │   ├── EngineResponseError *   resources/serving/errors.py
        │   ├── SpeculationMissing *    resources/serving/errors.py
        │   └── ServingBenchmarkFailed *  eagle_assets/benchmarks/serving_benchmark.py
        ├── MetricsFormatError *        resources/serving/prometheus.py
        ├── AcceptanceError *           resources/serving/acceptance.py
        └── PassInterrupted *           eagle_assets/benchmarks/serving_run.py

    EagleForgeWarning (UserWarning)
    └── EngineEmbeddingWarning *        eagle_assets/draft/export.py

Outside the tree, on purpose: ``resources.simulator.wire.BadRequest``, the simulator's way of answering
a request with 400 inside its own handler; it never leaves the server.
"""


class EagleForgeError(Exception):
    """Raised on purpose by eagle-forge, with a message that names the cause and what to do about it."""


class Systemic(EagleForgeError):
    """The cause is shared by every partition (a setting, the target's files, the simulator, the account):
    the next partition would fail the same way, so whoever runs them in turn (the demo) stops at the first.

    A marker only: the failure mapping treats these as it treats every non-resumable error (final)."""


class ConfigError(Systemic):
    """A setting, a configuration file or an environment variable names something that cannot be used:
    nothing was spent, and rerunning without fixing the setting fails the same way."""


class DataError(EagleForgeError):
    """The input data (prompt files, Hub datasets, shards, prompt sets) cannot be used as it is."""


class GenerationError(EagleForgeError):
    """The journal, the budget ledger or the generation plan refuse to let this run go on."""


class Resumable(EagleForgeError):
    """The run stopped, but what it did is kept and rerunning continues where it stopped.

    The failure mapping lets these through as they are, so the run fails with their own class and
    Dagster may retry it; every other project error is final for the run."""


class LeaseLost(GenerationError, Resumable):
    """This run's lease (its ledger owner, or its partition's fence) was lost: it must stop writing now,
    and a rerun takes the lease again and continues from the journal."""


class OpenRouterError(EagleForgeError):
    """The OpenRouter account, its providers under the configured policy, or the bundled simulator."""


class TargetError(EagleForgeError):
    """The target model's side: its tokenizer files, its chat template, its hidden states and their store."""


class EngineError(EagleForgeError):
    """A serving engine (SGLang, vLLM), or the numbers the benchmark read from one."""


class EagleForgeWarning(UserWarning):
    """Base of the project's warnings: a result is usable, but something about it needs a person's eye."""
