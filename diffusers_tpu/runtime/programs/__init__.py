"""Compiled programs: how they are built, stored ahead, and warmed up before serving."""
