"""Pure scaling decisions: no I/O, no clock reads, no logging. Time comes in as an argument."""
