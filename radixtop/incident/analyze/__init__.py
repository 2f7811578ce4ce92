"""`radixtop analyze`: a trace on the simulator's radix cache in-process."""
