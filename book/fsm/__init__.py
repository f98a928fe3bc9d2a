"""Chapter 1, FSM compression: the savings figure, the automaton tables and drawings, the lesson's numbers and
tables, and the exercises."""
