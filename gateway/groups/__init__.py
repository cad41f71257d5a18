"""Groups and the judge: RULER's judge, its prompt and verdicts (``ruler.py``), a group scored and
its rewards stored, and the automatic RULER task (``scoring.py``), and idle groups closed
(``idle.py``)."""
