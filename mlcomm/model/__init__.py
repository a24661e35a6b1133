"""The model: the machine's measured constants (:mod:`.machine`, a profile) and the cost
model that reads them (:mod:`.cost`)."""
