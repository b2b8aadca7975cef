"""Exercise graders, one module per topic (``setup.py``, ``collectives.py``, ...).

Each module registers its graders with :func:`dtlab.quiz.exercises.exercise`; they are imported
lazily by :func:`dtlab.quiz.exercises.check_exercise`, so nothing here is imported eagerly.
"""
