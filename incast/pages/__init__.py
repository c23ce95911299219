"""The documentation's pages drawn from kept results: the scoreboard, the tables of
measured numbers, the references, and `incast catalog`, which keeps them current."""
