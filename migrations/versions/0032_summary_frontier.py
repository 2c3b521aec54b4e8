"""A session's summary bookkeeping keeps the newest turn its last summary counted.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-07

Whether a session is due a background summary compares its turns with the count
the last summary took (``turns_at_summary``). Every append after the cooldown
asked that question by counting all of the session's turns: an append's cost grew
with the session (server CPU of an append and its check, 1.1 ms in a session of 10
turns, 2.2 ms in one of 5,000).

``summarised_through`` is the id of the last of those ``turns_at_summary``
turns, in id order. While it is set, the session holds exactly that many turns
up to it and every later turn is new, so the rule counts only the turns after it,
and at most as many as a summary needs (harbor.summary_due_rows). A summary's
finish sets it; a deletion of any of the session's turns clears it (a trigger
on ``harbor.messages``), and with it cleared the rule counts every turn, as
before. Existing sessions start cleared.

The function that counts the turns after it, the trigger and the candidate-search
role's grants on the table are in sql/functions/tiers.sql, made only once the column
exists. Downgrade drops the column, the trigger and its function, and those grants.
"""

from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("alter table harbor.session_state add column summarised_through bigint")


def downgrade() -> None:
    op.execute(
        """
drop trigger if exists messages_forget_summary_frontier on harbor.messages;
drop function if exists harbor._forget_summary_frontier();
revoke select on harbor.session_state from harbor_search;
alter table harbor.session_state drop column summarised_through;
"""
    )
