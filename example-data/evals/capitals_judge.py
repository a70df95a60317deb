"""LLM as a judge in Inspect: a Tinker model grades the answers (the docs' example, runnable offline).

    inspect eval example-data/evals/capitals_judge.py --model tinker-cookbook/HuggingFaceTB/SmolLM2-135M-Instruct
    inspect eval example-data/evals/capitals_judge.py --model tinker-cookbook/HuggingFaceTB/SmolLM2-135M-Instruct \\
        -T grader_model=tinker://RUN/sampler_weights/final

The grader is ``InspectAPIFromTinkerSampling`` over a sampling client, wrapped in an Inspect ``Model``. Without
``grader_model`` the model being evaluated grades itself. A 135M-parameter model is a weak grader; the point is
the wiring, which is the same for a strong grader model.
"""

from __future__ import annotations

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import GenerateConfig, Model
from inspect_ai.scorer import model_graded_qa
from inspect_ai.solver import generate

QA_DATASET = MemoryDataset(
    name="capitals",
    samples=[
        Sample(input="What is the capital of France?", target="Paris"),
        Sample(input="What is the capital of Italy?", target="Rome"),
        Sample(input="What is the capital of Japan?", target="Tokyo"),
        Sample(input="What is the capital of Egypt?", target="Cairo"),
    ],
)


def tinker_grader(grader_model: str, renderer_name: str | None = None) -> Model:
    """An Inspect model that samples from ``grader_model`` (a base model name or a ``tinker://`` sampler path)."""
    from tinker_cookbook import tinker
    from tinker_cookbook.eval.inspect_utils import InspectAPIFromTinkerSampling

    service_client = tinker.ServiceClient()
    if grader_model.startswith("tinker://"):
        sampling_client = service_client.create_sampling_client(model_path=grader_model)
    else:
        sampling_client = service_client.create_sampling_client(base_model=grader_model)
    api = InspectAPIFromTinkerSampling(renderer_name=renderer_name, model_name=grader_model,
                                       sampling_client=sampling_client, verbose=False)
    return Model(api=api, config=GenerateConfig(temperature=0.0, max_tokens=128))


@task
def capitals_judge(grader_model: str | None = None, grader_renderer_name: str | None = None) -> Task:
    return Task(
        dataset=QA_DATASET,
        solver=generate(),
        scorer=model_graded_qa(
            instructions="Grade strictly against the target text as general answer key and rubric. "
            "Respond 'GRADE: C' if correct or 'GRADE: I' otherwise.",
            partial_credit=False,
            # None: the model being evaluated grades its own answers
            model=tinker_grader(grader_model, grader_renderer_name) if grader_model else None,
        ),
        config=GenerateConfig(temperature=0.0, max_tokens=64),
    )
