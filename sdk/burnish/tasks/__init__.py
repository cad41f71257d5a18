"""Task suites played against a policy through the gateway: the runner and its environments.

    from burnish.tasks import Schedule, train
    from burnish.tasks.reasoning_gym import ReasoningGym

    async with AsyncClient("http://127.0.0.1:8080", admin_token=...) as client:
        curve = await train(client, ReasoningGym("gcd", {"max_value": 50}), "agent", Schedule(minutes=20, eval_minutes=10))

``environment.py`` says what an environment is; ``runner.py`` plays one; ``reasoning_gym.py``
and ``textarena.py`` are the suites that come with the SDK (each an extra: ``pip install
'burnish-sdk[reasoning-gym]'``); ``cli.py`` is the ``burnish-tasks`` command.
"""

from burnish.tasks.environment import Chat, Environment, Sampling, Score, TaskError, Teachable
from burnish.tasks.runner import Curve, Eval, Schedule, evaluate, play_round, teach, teacher_score, train, write_plot

__all__ = [
    "Chat",
    "Curve",
    "Environment",
    "Eval",
    "Sampling",
    "Schedule",
    "Score",
    "TaskError",
    "Teachable",
    "evaluate",
    "play_round",
    "teach",
    "teacher_score",
    "train",
    "write_plot",
]
