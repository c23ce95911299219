"""Checks lab 5: the student's program compiles and passes the packet tests of
forwarding, class queues and byte-limit admission (incast lab check 5)."""
from incast.labs import p4_missing, p4_packet_tests, p4_program, sentence

TESTS = "forwards_to_the_learned_port or classifies_dscp or byte_limit_admission"


def missing() -> list[str]:
    return p4_missing()


def check(answers: dict, lab) -> list[str]:
    program, problems = p4_program(answers, 5, "occ_bytes.write")
    if program is None:
        return problems
    problems += p4_packet_tests(program, TESTS)
    sentence(answers, "why_count_bytes_in_p4", ("packet", "byte", "frame"),
             "what does bmv2's own queue count?", problems)
    return problems
