"""Checks lab 6: the student's PAUSE decisions pass the packet tests of PAUSE at XOFF
and XON at the last congested port's fall (incast lab check 6), and the headroom is
worked out."""
from incast.labs import close, p4_missing, p4_packet_tests, p4_program, sentence

TESTS = "pause_at_xoff_and_xon or xon_waits_for_the_congested_port"
SENDERS, FRAME = 8, 1514


def missing() -> list[str]:
    return p4_missing()


def check(answers: dict, lab) -> list[str]:
    problems: list[str] = []
    headroom = SENDERS * 2 * FRAME
    if not close(answers.get("headroom_bytes"), headroom, rel=0.05):
        given = answers.get("headroom_bytes")
        hint = ("count both frames per sender" if close(given, headroom / 2, rel=0.05) else
                "each of the 8 senders delivers the frame it is sending and one more, 1514 bytes each")
        problems.append(f"headroom_bytes: {given} is not it: {hint}")
    sentence(answers, "why_headroom", ("wire", "flight", "react", "already", "delay", "in transit", "on its way"),
             "what is still arriving after the PAUSE leaves the switch?", problems)
    program, found = p4_program(answers, 6, "congested_ports.write")
    problems += found
    if program is not None:
        problems += p4_packet_tests(program, TESTS)
    return problems
