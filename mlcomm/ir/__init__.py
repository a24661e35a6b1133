"""The intermediate representation: schedules, the programs they lower to, and the reference
executor that runs a schedule in one process. Imports nothing of mlcomm."""
