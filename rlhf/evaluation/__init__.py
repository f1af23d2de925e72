"""Evaluation by reward and win rate: sampling a policy's responses and scoring them with a judge
(a reward model, a built-in world's gold reward or reward functions), means with intervals and
paired comparisons (judging.py); a reward model's accuracy and margins on held-out pairs
(pair_stats.py); length control, win rates against length (length_control.py); the judge-free
verdict of held-out human labels, a policy's log-ratios to its baseline on the chosen and the
rejected responses (label_pairs.py)."""
