select
    c.k as customer,
    c.v as name,
    count(o.order_id) as orders,
    coalesce(sum(o.amount), 0) as total
from {{ source('reconcile_plugin', 'customers') }} as c
left join {{ source('reconcile', 'orders') }} as o on o.customer = c.k
group by c.k, c.v
