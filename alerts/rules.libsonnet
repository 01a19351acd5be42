// Recording rules computed straight from vLLM's counters, for users who want the SD
// signals in Prometheus without running the exporter (and as a cross-check of it).
//
// Naming follows `level:metric:operations`: the level names the labels kept
// (`model_name`; `job` and the cluster label are always kept as well), the metric drops
// vLLM's `vllm:` prefix (recorded names may contain colons only as separators) and the
// operations end with the rate window, e.g.
// model_name:vllm_spec_decode_acceptance_rate:ratio_rate5m.
//
// Ratios are formed from summed numerators and denominators (never averaged), and every
// denominator is guarded with `> 0`: with no drafts in the window the ratio is absent, not
// 0 and not NaN, so an idle server never looks like a server with bad acceptance.
{
  local c = $._config,
  local w = c.rateWindow,
  local by = '%s, job, model_name' % c.clusterLabel,
  local level = 'model_name',
  local name(metric, ops) = '%s:%s:%s' % [level, metric, ops],

  // Names of the recorded series, for the alerts and dashboards that read them.
  _recordedNames:: {
    draftTokens: name('vllm_spec_decode_num_draft_tokens', 'rate' + w),
    acceptedTokens: name('vllm_spec_decode_num_accepted_tokens', 'rate' + w),
    drafts: name('vllm_spec_decode_num_drafts', 'rate' + w),
    acceptanceRate: name('vllm_spec_decode_acceptance_rate', 'ratio_rate' + w),
    acceptanceAlpha: name('vllm_spec_decode_acceptance_alpha', 'ratio_rate' + w),
    acceptanceLength: name('vllm_spec_decode_acceptance_length', 'ratio_rate' + w),
    draftLength: name('vllm_spec_decode_draft_length', 'ratio_rate' + w),
    draftLengthConfigured: name('vllm_spec_decode_draft_length_configured', 'max'),
    positionAcceptanceRate:
      'model_name_position:vllm_spec_decode_position_acceptance_rate:ratio_rate' + w,
    arrivalRate: name('vllm_request_success', 'rate' + w),
  },
  local n = self._recordedNames,

  local sumRate(metric) =
    'sum by (%(by)s) (rate(%(metric)s{%(sel)s}[%(w)s]))' % {
      by: by,
      metric: metric,
      sel: c.vllmSelector,
      w: w,
    },

  prometheusRules+:: {
    groups+: [
      {
        name: 'specwatch-vllm-spec-decode.rules',
        rules: [
          {
            // Draft tokens proposed and verified per second.
            record: n.draftTokens,
            expr: sumRate('vllm:spec_decode_num_draft_tokens_total'),
          },
          {
            // Draft tokens accepted per second (the bonus token is not included).
            record: n.acceptedTokens,
            expr: sumRate('vllm:spec_decode_num_accepted_tokens_total'),
          },
          {
            // Verification steps (request x engine step with at least one draft) per second.
            record: n.drafts,
            expr: sumRate('vllm:spec_decode_num_drafts_total'),
          },
          {
            // vLLM's acceptance rate: accepted / proposed draft tokens, 0-1.
            record: n.acceptanceRate,
            expr: '%s\n/\n(%s > 0)\n' % [n.acceptedTokens, n.draftTokens],
          },
          {
            // The draft-length-independent acceptance α (the exporter's sd_acceptance_alpha,
            // method first_position): the share of verification steps whose first draft
            // token was accepted. Unlike the rate above it does not fall with k; at k = 1 it
            // equals it. Absent on servers without per-position counters (vLLM V0).
            record: n.acceptanceAlpha,
            expr: |||
              sum by (%(by)s) (
                rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{%(sel)s, position="0"}[%(w)s])
              )
              /
              (%(drafts)s > 0)
            ||| % { by: by, sel: c.vllmSelector, w: w, drafts: n.drafts },
            labels: { method: 'first_position' },
          },
          {
            // Mean tokens committed per verification step, bonus token included: 1..k+1.
            record: n.acceptanceLength,
            expr: '1 + %s\n/\n(%s > 0)\n' % [n.acceptedTokens, n.drafts],
          },
          {
            // Effective draft length: draft tokens per verification step (<= configured k).
            record: n.draftLength,
            expr: '%s\n/\n(%s > 0)\n' % [n.draftTokens, n.drafts],
          },
          {
            // Configured k: vLLM creates one per-position series per draft position at
            // startup, whether or not traffic has reached it.
            record: n.draftLengthConfigured,
            expr: |||
              max by (%(by)s) (
                count by (%(by)s, instance, engine) (
                  vllm:spec_decode_num_accepted_tokens_per_pos_total{%(sel)s}
                )
              )
            ||| % { by: by, sel: c.vllmSelector },
          },
          {
            // Share of verification steps whose draft token at `position` was accepted.
            record: n.positionAcceptanceRate,
            expr: |||
              sum by (%(by)s, position) (
                rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{%(sel)s}[%(w)s])
              )
              / on (%(by)s) group_left ()
              (%(drafts)s > 0)
            ||| % { by: by, sel: c.vllmSelector, w: w, drafts: n.drafts },
          },
          {
            // Finished requests per second, vLLM's closest signal to the arrival rate
            // (vLLM has no arrival counter; in steady state completions equal arrivals).
            record: n.arrivalRate,
            expr: sumRate('vllm:request_success_total'),
          },
        ],
      },
    ],
  },
}
